// The compiled part of the sharded strategies' shared base.
#include <loom/checkpoint/io.hpp>
#include <loom/errors.hpp>
#include <loom/strategy/distributed_runtime.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/placement.hpp>
#include <loom/strategy/sharded_parallel.hpp>

#include <string>
#include <vector>

namespace loom {

std::optional<double> sharded_parallel::clip_gradients(module_state& engine, torch::nn::Module& module,
                                                       const clip_options& options) {
  std::vector<std::weak_ptr<detail::fsdp_engine>> engines;
  if (engine) engines.push_back(engine);
  return detail::clip_placed(detail::placements_of(engines, {&module}), options);
}

detail::fsdp_counters sharded_parallel::gradient_collectives() const {
  detail::fsdp_counters total;
  engines_.for_each([&](const detail::fsdp_engine& engine) {
    const detail::fsdp_counters& c = engine.counters();
    total.all_gathers += c.all_gathers;
    total.reduce_scatters += c.reduce_scatters;
    total.all_reduces += c.all_reduces;
    total.prefetches += c.prefetches;
    total.offload_to_device += c.offload_to_device;
    total.offload_to_host += c.offload_to_host;
  });
  return total;
}

auto sharded_parallel::add_engine(torch::nn::Module& module, comm::process_group& group, const fsdp_options& options)
    -> module_state {
  auto engine = std::make_shared<detail::fsdp_engine>(module, group, options, runtime().local_world_size(), precision_);
  engines_.add(engine);
  return engine;
}

std::optional<detail::construction_sharding> sharded_parallel::construction_sharding_of(
    const fsdp_options& options) const {
  const bool shards =
      options.strategy == sharding_strategy::full_shard || options.strategy == sharding_strategy::hybrid_shard;
  if (!shards || world_size() < 2) return std::nullopt;
  return detail::construction_sharding{&world_group(), options.sync_module_states};
}

void sharded_parallel::save_full_or_sharded(bool full, std::string_view strategy, std::string_view to_filter,
                                            const std::string& path, const state& checkpoint,
                                            const state_filter& filter, const checkpoint_metadata& metadata) {
  if (full) {
    detail::save_gathered_state(engines_.entries(), checkpoint, filter, metadata, path, /*root=*/0, group());
    barrier();
    return;
  }
  if (!filter.empty()) {
    throw configuration_error(std::string(strategy) +
                              ": a filter is refused for sharded saves (as Lightning's, pytorch#105379); " +
                              std::string(to_filter) + " to filter a full save");
  }
  save_sharded_checkpoint(path, checkpoint, metadata,
                          detail::sharded_save_layout(checkpoint, engines_.entries(), strategy), group());
}

fsdp_no_sync_guard sharded_parallel::no_backward_sync(module_state& engine, bool enabled) {
  if (enabled && engine && engine->cpu_offload()) {
    throw configuration_error(std::string("no_backward_sync: the sharding engine offloads its shards to the CPU: ") +
                              detail::offload_refusal_reason);
  }
  return fsdp_no_sync_guard(engine.get(), enabled);
}

}  // namespace loom
