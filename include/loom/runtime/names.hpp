// Lightning's names for accelerators, strategies and precisions, which of them
// loom has built, and the rules for the LT_* variables that loom-run exports.
// No torch headers: loom-run validates its flags with this before it starts
// anything.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::runtime {

// Precision strings Lightning accepts, canonical ones first.
const std::vector<std::string>& precision_names();
// "32" -> "32-true", "16" -> "16-mixed", "bf16" -> "bf16-mixed", "64" -> "64-true",
// canonical names unchanged; nullopt for an unknown name.
std::optional<std::string> canonical_precision(std::string_view name);

// cpu, gpu, cuda, mps, tpu, auto.
const std::vector<std::string>& accelerator_names();
// "gpu" -> "cuda"; others unchanged; nullopt when unknown.
std::optional<std::string> canonical_accelerator(std::string_view name);

struct strategy_name {
  std::string name;
  bool built;          // loom has this strategy now
  std::string reason;  // why not, when not built ("no C++ meaning: use ddp")
  std::string description;
};
// Lightning's registry names plus loom's own, with what loom has built.
const std::vector<strategy_name>& strategy_names();
const strategy_name* find_strategy(std::string_view name);
// Names loom-run offers: built, and not spawn/fork/notebook/xla/tpu/offload
// (Lightning's filter for `fabric run`).
std::vector<std::string> cli_strategy_names();

// "a, b, c"
std::string join(const std::vector<std::string>& names);

// The checks a static Fabric<A, S, P> makes against loom-run's LT_* variables
// (Lightning raises when a constructor argument differs from the CLI's).
// Returns an error sentence, empty when all agree.
std::string cli_conflict(std::string_view accelerator, std::string_view strategy, std::string_view precision,
                         const std::optional<std::string>& devices, int num_nodes, bool num_nodes_given);

}  // namespace loom::runtime
