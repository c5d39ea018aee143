// One process on one device (Lightning's SingleDeviceStrategy): the module and
// batches are moved to the accelerator's device; nothing is communicated.
#pragma once

#include <loom/strategy/strategy_base.hpp>

#include <string_view>

namespace loom {

struct single_device : strategy_base {
  static constexpr std::string_view name = "single_device";
  // No gradients are synchronised, so there is nothing to skip: the guard is empty.
  static constexpr bool supports_no_backward_sync = true;

  no_context no_backward_sync(module_state& /*state*/, bool /*enabled*/ = true) { return {}; }
};

static_assert(Strategy<single_device>);

}  // namespace loom
