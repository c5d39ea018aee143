#include "builtin_combinations.hpp"

#include <loom/strategy/fsdp.hpp>

namespace loom::runtime::builtin {

namespace {
// fsdp_options under Lightning's FSDPStrategy argument names (and torch's
// FSDP ones where Lightning passes them through), over a preset's defaults.
fsdp_options read_fsdp(option_reader& reader, fsdp_options options) {
  read_process_options(reader, options.process);
  std::string strategy(to_string(options.strategy));
  reader.read("sharding_strategy", strategy, {"FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"});
  for (auto s : {sharding_strategy::full_shard, sharding_strategy::shard_grad_op, sharding_strategy::no_shard,
                 sharding_strategy::hybrid_shard}) {
    if (to_string(s) == strategy) options.strategy = s;
  }
  std::int64_t replicate = options.device_mesh ? options.device_mesh->first : 0;
  std::int64_t shard = options.device_mesh ? options.device_mesh->second : 0;
  reader.read("device_mesh_replicate", replicate, 0, 1 << 20);
  reader.read("device_mesh_shard", shard, 0, 1 << 20);
  if (replicate > 0 && shard > 0) options.device_mesh = std::pair<int, int>(static_cast<int>(replicate), static_cast<int>(shard));
  reader.read("auto_wrap_min_num_params", options.wrap_policy.min_num_params, 0, std::int64_t(1) << 50);
  std::vector<std::string> wrapped;
  reader.read("auto_wrap_policy", wrapped);
  options.wrap_policy.module_names.insert(wrapped.begin(), wrapped.end());
  reader.read("forward_prefetch", options.forward_prefetch);
  reader.read("backward_prefetch", options.backward_prefetch);
  reader.read("sync_module_states", options.sync_module_states);
  std::string dict_type = options.state_dict == state_dict_type::full ? "full" : "sharded";
  reader.read("state_dict_type", dict_type, {"sharded", "full"});
  options.state_dict = dict_type == "full" ? state_dict_type::full : state_dict_type::sharded;
  return options;
}
}  // namespace

std::vector<std::vector<registry_entry>> fsdp_entries() {
  return entries(preset<fsdp>{"fsdp", "loom::fsdp", [](option_reader& reader) { return fsdp(read_fsdp(reader, {})); }},
                 preset<fsdp_cpu_offload>{"fsdp_cpu_offload", "loom::fsdp_cpu_offload", [](option_reader& reader) {
                                            return fsdp_cpu_offload(read_fsdp(reader, {}));
                                          }});
}

}  // namespace loom::runtime::builtin
