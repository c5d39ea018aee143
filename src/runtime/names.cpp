#include <loom/runtime/names.hpp>

#include <algorithm>
#include <cstdlib>
#include <regex>

namespace loom::runtime {

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = {"64-true", "32-true", "16-true", "bf16-true", "16-mixed",
                                                 "bf16-mixed", "64", "32", "16", "bf16"};
  return names;
}

std::optional<std::string> canonical_precision(std::string_view name) {
  if (name == "64") return "64-true";
  if (name == "32") return "32-true";
  if (name == "16") return "16-mixed";
  if (name == "bf16") return "bf16-mixed";
  for (const auto& known : precision_names()) {
    if (known == name) return known;
  }
  return std::nullopt;
}

const std::vector<std::string>& accelerator_names() {
  static const std::vector<std::string> names = {"cpu", "gpu", "cuda", "mps", "tpu", "auto"};
  return names;
}

std::optional<std::string> canonical_accelerator(std::string_view name) {
  if (name == "gpu") return "cuda";
  for (const auto& known : accelerator_names()) {
    if (known == name) return known;
  }
  return std::nullopt;
}

const std::vector<strategy_name>& strategy_names() {
  static const std::vector<strategy_name> names = {
      {"single_device", true, "", "one process on one device"},
      {"parallel", true, "",
       "processes, ranks and collectives without gradient synchronisation (for codes that synchronise themselves)"},
      {"parallel_fork", true, "", "parallel, with processes forked by launch(fn)"},
      {"ddp", true, "", "distributed data parallel: bucketed, overlapped gradient all-reduce"},
      {"ddp_fork", true, "", "ddp with processes forked by launch(fn)"},
      {"ddp_find_unused_parameters_true", true, "", "ddp that finds parameters a forward left unused"},
      {"ddp_find_unused_parameters_false", true, "", "ddp (the default: every parameter is used)"},
      {"ddp_spawn", false, "it spawns Python processes by pickling; it has no C++ meaning: use ddp", ""},
      {"ddp_notebook", false, "it forks a notebook kernel; it has no C++ meaning: use ddp", ""},
      {"dp", false, "not built yet", "data parallel in one process"},
      {"fsdp", false, "not built yet", "fully sharded data parallel"},
      {"fsdp_cpu_offload", false, "not built yet", "fsdp with parameters offloaded to CPU"},
      {"deepspeed", false, "not built yet", "ZeRO"},
      {"deepspeed_stage_1", false, "not built yet", "ZeRO stage 1"},
      {"deepspeed_stage_2", false, "not built yet", "ZeRO stage 2"},
      {"deepspeed_stage_2_offload", false, "not built yet", "ZeRO stage 2 with offload"},
      {"deepspeed_stage_3", false, "not built yet", "ZeRO stage 3"},
      {"deepspeed_stage_3_offload", false, "not built yet", "ZeRO stage 3 with offload"},
      {"model_parallel", false, "not built yet", "tensor parallel and FSDP (2D)"},
      {"xla", false, "XLA/TPU has no LibTorch C++ backend", ""},
      {"xla_fsdp", false, "XLA/TPU has no LibTorch C++ backend", ""},
  };
  return names;
}

const strategy_name* find_strategy(std::string_view name) {
  for (const auto& entry : strategy_names()) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

std::vector<std::string> cli_strategy_names() {
  static const std::regex excluded(".*(spawn|fork|notebook|xla|tpu|offload).*");
  std::vector<std::string> out;
  for (const auto& entry : strategy_names()) {
    if (entry.built && !std::regex_match(entry.name, excluded)) out.push_back(entry.name);
  }
  return out;
}

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

namespace {
std::optional<std::string> variable(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}
}  // namespace

std::string cli_conflict(std::string_view accelerator, std::string_view strategy, std::string_view precision,
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

}  // namespace loom::runtime
