// RAII autocast on one device type, with torch.autocast's semantics: nested
// guards restore what they found, and leaving the outermost one clears the
// cache of casted weights (stale copies would survive an optimizer step).
// In util/ because precisions turn autocast on and strategies (deepspeed's
// bf16 forward) turn it off.
#pragma once

#include <loom/compat.hpp>

#include <ATen/autocast_mode.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

namespace loom {

class [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] autocast_guard {
 public:
  autocast_guard(c10::DeviceType device, c10::ScalarType dtype, bool enabled = true)
      : device_(device),
        previous_enabled_(compat::autocast_enabled(device)),
        previous_dtype_(compat::autocast_dtype(device)) {
    compat::set_autocast_enabled(device, enabled);
    compat::set_autocast_dtype(device, dtype);
    at::autocast::increment_nesting();
  }

  autocast_guard(const autocast_guard&) = delete;
  autocast_guard& operator=(const autocast_guard&) = delete;

  ~autocast_guard() {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    compat::set_autocast_enabled(device_, previous_enabled_);
    compat::set_autocast_dtype(device_, previous_dtype_);
  }

 private:
  c10::DeviceType device_;
  bool previous_enabled_;
  c10::ScalarType previous_dtype_;
};

}  // namespace loom
