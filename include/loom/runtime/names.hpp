// Lightning's names for accelerators, strategies and precisions, which of them
// loom has built, and the rules for the LT_* variables that loom-run exports.
// No torch headers: loom-run validates its flags with this before it starts
// anything.
#pragma once

#include <loom/concepts/compatibility_rules.hpp>
#include <loom/policy_names.hpp>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::runtime {

using loom::accelerator_names;
using loom::canonical_accelerator;
using loom::canonical_precision;
using loom::precision_names;

struct strategy_name {
  std::string name;
  bool built;          // loom has this strategy now
  // Why not, when not built ("no C++ meaning: use ddp"); when built, why it is
  // made from a strategy object only (model_parallel: its parallelize_fn).
  std::string reason;
  std::string description;
  // What the compatibility rules read (concepts/compatibility_rules.hpp):
  // the strategy type's is_distributed, devices and is_sharded.
  bool multi_process = true;
  rules::device_types devices = rules::device_types::all();
  bool sharded = false;
  bool scales_own_loss = false;  // deepspeed: its own loss scaler under 16-mixed
};
// Lightning's registry names plus loom's own, with what loom has built.
const std::vector<strategy_name>& strategy_names();
const strategy_name* find_strategy(std::string_view name);
// Names loom-run offers: built, and not spawn/fork/notebook/xla/tpu/offload
// (Lightning's filter for `fabric run`).
std::vector<std::string> cli_strategy_names();

// "a, b, c"
std::string join(const std::vector<std::string>& names);


}  // namespace loom::runtime
