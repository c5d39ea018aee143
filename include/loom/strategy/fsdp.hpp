// Fully sharded data parallel (Lightning's "fsdp", FSDPStrategy): the
// parallel strategy plus the sharding engine (fsdp_engine.hpp) over the
// model's units. Runs on Gloo (CPU) and NCCL alike; Lightning refuses FSDP on
// CPU, loom does not (docs/fsdp.md lists the differences).
#pragma once

#include <loom/compat.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/full_state.hpp>
#include <loom/strategy/live_engines.hpp>
#include <loom/strategy/no_sync_guard.hpp>
#include <loom/strategy/parallel.hpp>
#include <loom/strategy/unit.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

// The guard of fabric.no_backward_sync under FSDP (torch's FSDP.no_sync):
// backward passes inside it keep each unit's gradients unsharded and
// unreduced (one full gradient buffer per unit stays allocated: the memory
// of a DDP gradient); the next synced backward reduce-scatters the sum.
using fsdp_no_sync_guard = no_sync_guard<detail::fsdp_engine>;

struct fsdp : parallel {
  static constexpr std::string_view name = "fsdp";
  static constexpr bool is_sharded = true;
  static constexpr bool supports_no_backward_sync = true;

  // The sharding engine of each set-up module.
  using module_state = std::shared_ptr<detail::fsdp_engine>;

  fsdp() = default;
  explicit fsdp(fsdp_options options)
      : parallel(options.process),
        options_(std::move(options)) {}

  void setup_environment(const strategy_environment& environment) {
    parallel::setup_environment(environment);
    precision_ = environment.precision;
  }

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true) {
    comm::process_group& world = this->group();
    if (move_to_device) module.to(this->device_);
    auto engine =
        std::make_shared<detail::fsdp_engine>(module, world, options_, runtime().local_world_size(), precision_);
    engines_.add(engine);
    return engine;
  }

  // fabric.init_module(true): FULL_SHARD and HYBRID_SHARD over more than
  // one rank shard each loom::unit<M> as it is built, over the world
  // (unit_construction.hpp; HYBRID_SHARD's setup gathers each unit once and
  // shards it over its shard group); SHARD_GRAD_OP and NO_SHARD keep whole
  // parameters after setup, so construction builds them whole.
  std::optional<detail::construction_sharding> construction_sharding() const {
    const bool shards = options_.strategy == sharding_strategy::full_shard ||
                        options_.strategy == sharding_strategy::hybrid_shard;
    if (!shards || world_size() < 2) return std::nullopt;
    return detail::construction_sharding{&runtime_pointer()->group(), options_.sync_module_states};
  }

  template <class Forward>
  auto forward(module_state& engine, torch::nn::Module& /*module*/, Forward&& run) {
    return detail::forward_through(*engine, std::forward<Forward>(run));
  }

  fsdp_no_sync_guard no_backward_sync(module_state& engine, bool enabled = true) {
    if (enabled && engine->cpu_offload()) {
      throw configuration_error(std::string("no_backward_sync: strategy 'fsdp' with cpu_offload: ") +
                                detail::offload_refusal_reason);
    }
    return fsdp_no_sync_guard(*engine, enabled);
  }

  // As asked: the engine writes each reduced shard into a gradient that is
  // none and adds into one that is defined (zeroed, or accumulating under
  // no_backward_sync), so both ways train alike; in place keeps the shard's
  // gradient memory, as PyTorch's FSDP does with set_to_none=False.
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) { compat::zero_grad(optimizer, set_to_none); }

  // The norm over every rank's gradient shards: the single-device norm.
  template <class State>
  std::optional<double> clip_gradients(State& engine, torch::nn::Module& /*module*/, const clip_options& options) {
    return engine->clip_gradients(options);
  }

  // Collectives the engines of this strategy's live modules have issued.
  detail::fsdp_counters gradient_collectives() const {
    detail::fsdp_counters total;
    engines_.for_each([&](const detail::fsdp_engine& engine) {
      const auto& c = engine.counters();
      total.all_gathers += c.all_gathers;
      total.reduce_scatters += c.reduce_scatters;
      total.all_reduces += c.all_reduces;
      total.prefetches += c.prefetches;
      total.offload_to_device += c.offload_to_device;
      total.offload_to_host += c.offload_to_host;
    });
    return total;
  }

  // ------------------------------------------------------------ checkpoints
  // Sharded (Lightning's default state_dict_type): a directory, each rank's
  // file holding its shards keyed by parameter name, meta.pt written last.
  // Full: each parameter and optimizer state tensor gathered to rank 0 as
  // its record is written, then dropped; one file loadable by
  // single_device, ddp and fsdp of any world size.
  void save_checkpoint(const std::string& path, const state& checkpoint, const state_filter& filter,
                       const checkpoint_metadata& metadata) {
    if (options_.state_dict == state_dict_type::full) {
      detail::save_gathered_state(engines_.entries(), checkpoint, filter, metadata, path, /*root=*/0, group());
      barrier();
      return;
    }
    if (!filter.empty()) {
      throw configuration_error("fsdp: a filter is refused for sharded saves (as Lightning, pytorch#105379); save "
                                "with state_dict_type=full to filter");
    }
    loom::save_sharded_checkpoint(path, checkpoint, metadata, detail::sharded_save_layout(checkpoint, engines_.entries(), name),
                                  group());
  }
  // Full or sharded, written by any number of ranks: each rank reads only
  // its parts, in place (load_local_parts), and all ranks load or none.
  state load_checkpoint(const std::string& path, const state& checkpoint, bool strict) {
    return detail::load_local_state(engines_.entries(), checkpoint, path, strict, group());
  }

  const fsdp_options& options() const noexcept { return options_; }
  // What the next fabric.save writes (Lightning's state_dict_type).
  void set_state_dict_type(loom::state_dict_type type) noexcept { options_.state_dict = type; }

 protected:
  // Runs body with every live engine's parameters (and the checkpoint's
  // optimizers' state) full-sized.
  template <class Body>
  void with_full_state(const state& checkpoint, int root, Body&& body) {
    detail::with_full_state(engines_.entries(), checkpoint.modules(), checkpoint.optimizers(),
                            /*keeps=*/root < 0 || root == global_rank(), body);
  }

  fsdp_options options_;
  precision_dtypes precision_;
  detail::live_engines<detail::fsdp_engine> engines_;
};

// Lightning's preset "fsdp_cpu_offload" (cpu_offload=True, FULL_SHARD).
// no_backward_sync is refused at compile time: the skipped reductions would
// keep every unit's unsharded gradient on the device, which is what offload
// is for (torch 1.13 got this combination wrong: pytorch#98494).
struct fsdp_cpu_offload : fsdp {
  static constexpr std::string_view name = "fsdp_cpu_offload";
  static constexpr bool supports_no_backward_sync = false;

  fsdp_cpu_offload() : fsdp(offloaded({})) {}
  explicit fsdp_cpu_offload(fsdp_options options) : fsdp(offloaded(std::move(options))) {}

 private:
  static fsdp_options offloaded(fsdp_options options) {
    options.cpu_offload = true;
    return options;
  }
};

static_assert(Strategy<fsdp>);
static_assert(Strategy<fsdp_cpu_offload>);

}  // namespace loom
