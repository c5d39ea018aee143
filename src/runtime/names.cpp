#include <loom/runtime/names.hpp>

#include <algorithm>
#include <cstdlib>
#include <regex>

namespace loom::runtime {

const std::vector<strategy_name>& strategy_names() {
  static const std::vector<strategy_name> names = {
      {"single_device", true, "", "one process on one device", /*multi_process=*/false},
      {"parallel", true, "",
       "processes, ranks and collectives without gradient synchronisation (for codes that synchronise themselves)"},
      {"parallel_fork", true, "", "parallel, with processes forked by launch(fn)"},
      {"ddp", true, "", "distributed data parallel: bucketed, overlapped gradient all-reduce"},
      {"ddp_fork", true, "", "ddp with processes forked by launch(fn)"},
      {"ddp_find_unused_parameters_true", true, "", "ddp that finds parameters a forward left unused"},
      {"ddp_find_unused_parameters_false", true, "", "ddp (the default: every parameter is used)"},
      {"ddp_spawn", false, "it spawns Python processes by pickling; it has no C++ meaning: use ddp", ""},
      {"ddp_notebook", false, "it forks a notebook kernel; it has no C++ meaning: use ddp", ""},
      {"dp", true,
       "dp scatters forward's arguments, which the type-erased Fabric does not pass: use the static "
       "loom::Fabric<loom::cuda, loom::dp, P> (on cpu the connector falls back to ddp, as Lightning)",
       "data parallel in one process: the module replicated on each device, the batch split along dimension 0",
       /*multi_process=*/false, /*devices=*/{rules::device_type::cuda}},
      {"fsdp", true, "", "fully sharded data parallel: parameters, gradients and optimizer state sharded",
       true, rules::device_types::all(), /*sharded=*/true},
      {"fsdp_cpu_offload", true, "", "fsdp with parameter shards kept on the CPU between uses", true, rules::device_types::all(),
       /*sharded=*/true},
      {"deepspeed", true, "", "ZeRO stage 2 (Lightning's default): gradients and optimizer state sharded", true,
       rules::device_types::all(), /*sharded=*/true, /*scales_own_loss=*/true},
      {"deepspeed_stage_1", true, "", "ZeRO stage 1: optimizer state sharded", true, rules::device_types::all(), /*sharded=*/true, /*scales_own_loss=*/true},
      {"deepspeed_stage_1_offload", true, "", "ZeRO stage 1 with the optimizer offloaded to the CPU", true, rules::device_types::all(), /*sharded=*/true, /*scales_own_loss=*/true},
      {"deepspeed_stage_2", true, "", "ZeRO stage 2: gradients and optimizer state sharded", true, rules::device_types::all(),
       /*sharded=*/true, /*scales_own_loss=*/true},
      {"deepspeed_stage_2_offload", true, "", "ZeRO stage 2 with the optimizer offloaded to the CPU", true, rules::device_types::all(), /*sharded=*/true, /*scales_own_loss=*/true},
      {"deepspeed_stage_3", true, "", "ZeRO stage 3: parameters, gradients and optimizer state sharded", true, rules::device_types::all(), /*sharded=*/true, /*scales_own_loss=*/true},
      {"deepspeed_stage_3_offload", true, "", "ZeRO stage 3 with optimizer and parameters offloaded to the CPU",
       true, rules::device_types::all(), /*sharded=*/true, /*scales_own_loss=*/true},
      {"deepspeed_stage_3_offload_nvme", true, "",
       "ZeRO stage 3 with optimizer and parameters offloaded to NVMe (not built yet: refused at setup)", true, rules::device_types::all(), /*sharded=*/true, /*scales_own_loss=*/true},
      {"model_parallel", true,
       "its parallelize_fn is code, which a name cannot carry: pass the strategy object, "
       "make_fabric(config, loom::model_parallel({.parallelize_fn = ...})), or use loom::Fabric<A, loom::model_parallel, P>",
       "tensor parallel and FSDP on a 2-D mesh (data_parallel x tensor_parallel)", true, rules::device_types::all(),
       /*sharded=*/true},
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

}  // namespace loom::runtime
