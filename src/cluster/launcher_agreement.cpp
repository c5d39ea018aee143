// launcher_conflict: a static Fabric's types against loom-run's LT_* values.
#include <loom/cluster/launcher_agreement.hpp>
#include <loom/policy_names.hpp>

#include <loom/environment.hpp>

namespace loom::cluster {

namespace {
std::optional<std::string> variable(const char* name) { return process_environment()(name); }
}  // namespace

std::string launcher_conflict(std::string_view accelerator, std::string_view strategy, std::string_view precision,
                              const std::optional<std::string>& devices, int num_nodes, bool num_nodes_given) {
  if (variable("LT_CLI_USED").value_or("") != "1") return {};
  std::string problems;
  auto add = [&](const std::string& text) { problems += (problems.empty() ? "" : "; ") + text; };
  if (auto cli = variable("LT_ACCELERATOR"); cli && *cli != "auto") {
    if (canonical_accelerator(*cli).value_or(*cli) != canonical_accelerator(accelerator).value_or(std::string(accelerator))) {
      add("the code has accelerator '" + std::string(accelerator) + "' but the CLI gave --accelerator=" + *cli);
    }
  }
  // Presets name the strategy with its options: ddp_find_unused_parameters_true is a ddp.
  auto family = [](std::string_view name) {
    return name.rfind("ddp_find_unused_parameters", 0) == 0 ? std::string_view("ddp") : name;
  };
  if (auto cli = variable("LT_STRATEGY"); cli && *cli != "auto" && family(*cli) != strategy) {
    add("the code has strategy '" + std::string(strategy) + "' but the CLI gave --strategy=" + *cli);
  }
  if (auto cli = variable("LT_PRECISION")) {
    if (canonical_precision(*cli).value_or(*cli) != precision) {
      add("the code has precision '" + std::string(precision) + "' but the CLI gave --precision=" + *cli);
    }
  }
  if (auto cli = variable("LT_DEVICES"); cli && devices && *cli != *devices) {
    add("the code has devices=" + *devices + " but the CLI gave --devices=" + *cli);
  }
  if (auto cli = variable("LT_NUM_NODES"); cli && num_nodes_given && *cli != std::to_string(num_nodes)) {
    add("the code has num_nodes=" + std::to_string(num_nodes) + " but the CLI gave --num-nodes=" + *cli);
  }
  if (problems.empty()) return {};
  return "this program was started by loom-run, and its Fabric conflicts with the command line: " + problems +
         ". Remove the value from the command line or from the Fabric type/options.";
}

}  // namespace loom::cluster
