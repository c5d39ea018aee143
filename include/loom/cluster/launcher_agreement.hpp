// Whether a static Fabric<A, S, P> agrees with how loom-run started the
// program: loom-run exports its --accelerator/--strategy/--precision/--devices/
// --num-nodes as LT_* variables, and Lightning raises when a constructor
// argument differs from the CLI's. Torch-free.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace loom::cluster {

// An error sentence naming every disagreement, empty when all agree (or when
// the program was not started by loom-run).
std::string launcher_conflict(std::string_view accelerator, std::string_view strategy, std::string_view precision,
                              const std::optional<std::string>& devices, int num_nodes, bool num_nodes_given);

}  // namespace loom::cluster
