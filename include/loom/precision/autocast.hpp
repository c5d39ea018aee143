// RAII autocast on one device type, with torch.autocast's semantics: nested
// guards restore what they found, and leaving the outermost one clears the
// cache of casted weights (stale copies would survive an optimizer step).
#pragma once

#include <loom/compat.hpp>

#include <ATen/autocast_mode.h>
#include <c10/core/DefaultDtype.h>

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

// Sets torch's default dtype for its lifetime (Lightning's _DtypeContextManager):
// modules built and factory tensors made inside get this dtype.
class [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] default_dtype_guard {
 public:
  explicit default_dtype_guard(c10::ScalarType dtype) : previous_(c10::get_default_dtype()) {
    c10::set_default_dtype(caffe2::TypeMeta::fromScalarType(dtype));
  }
  default_dtype_guard(const default_dtype_guard&) = delete;
  default_dtype_guard& operator=(const default_dtype_guard&) = delete;
  ~default_dtype_guard() { c10::set_default_dtype(previous_); }

 private:
  caffe2::TypeMeta previous_;
};

}  // namespace loom
