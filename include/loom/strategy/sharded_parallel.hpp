// What every strategy whose parameters live in the sharding engine's shards
// shares (fsdp, deepspeed, model_parallel), written once: the engines of the
// live modules (the dead pruned as new ones come), the forward through one,
// the deferred reduction of no_backward_sync, the norm over the placements,
// the engines' counters, the full-state scope, and checkpoints saved full or
// sharded and loaded in place from either. Each strategy decides only which
// group and options its engines get and what it adds (deepspeed's masters,
// model_parallel's mesh); none inherits another's setup.
#pragma once

#include <loom/compat.hpp>
#include <loom/strategy/fsdp_engine_calls.hpp>
#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/full_state.hpp>
#include <loom/strategy/live_engines.hpp>
#include <loom/strategy/no_sync_guard.hpp>
#include <loom/strategy/parallel.hpp>
#include <loom/strategy/unit.hpp>  // loom::unit<M>: how a model declares its units to every sharded strategy
#include <loom/strategy/unit_construction.hpp>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

// The guard of fabric.no_backward_sync under a sharding engine (torch's
// FSDP.no_sync): backward passes inside it keep each unit's gradients
// unsharded and unreduced (one full gradient buffer per unit stays
// allocated: the memory of a DDP gradient); the next synced backward
// reduce-scatters the sum. Without an engine (a dimension of one rank) it
// does nothing.
using fsdp_no_sync_guard = no_sync_guard<detail::fsdp_engine>;

struct sharded_parallel : parallel {
  static constexpr bool is_sharded = true;

  // The sharding engine of each set-up module; null where the module is not
  // sharded (model_parallel on one data-parallel rank).
  using module_state = std::shared_ptr<detail::fsdp_engine>;

  using parallel::parallel;

  void setup_environment(const strategy_environment& environment) {
    parallel::setup_environment(environment);
    precision_ = environment.precision;
  }

  // Each sharded strategy says how its modules are set up (deepspeed only
  // together with their optimizer): none takes parallel's.
  module_state setup_module(torch::nn::Module&, bool = true) = delete;

  template <class Forward>
  auto forward(module_state& engine, torch::nn::Module& /*module*/, Forward&& run) {
    if (!engine) return std::forward<Forward>(run)();
    return detail::forward_through(*engine, std::forward<Forward>(run));
  }

  // Refused where the engine offloads (offload_refusal_reason).
  fsdp_no_sync_guard no_backward_sync(module_state& engine, bool enabled = true);

  // As asked: the engine writes each reduced shard into a gradient that is
  // none and adds into one that is defined (zeroed, or accumulating under
  // no_backward_sync), so both ways train alike; in place keeps the shard's
  // gradient memory, as PyTorch's FSDP does with set_to_none=False.
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) { compat::zero_grad(optimizer, set_to_none); }

  // The single-device norm, over the placements: the engine's slices summed
  // over its group, tensor-parallel chunks over theirs, replicas counted once.
  std::optional<double> clip_gradients(module_state& engine, torch::nn::Module& module, const clip_options& options);

  // Collectives the engines of this strategy's live modules have issued.
  detail::fsdp_counters gradient_collectives() const;

  // Full or sharded, written by any strategy on any number of ranks: each
  // rank reads only its parts, in place (load_local_parts), and all ranks
  // load or none.
  state load_checkpoint(const std::string& path, const state& checkpoint, bool strict) {
    return detail::load_local_state(engines_.entries(), checkpoint, path, strict, group());
  }

 protected:
  // An engine over `group` for module (which the strategy has moved and
  // prepared), kept among the live ones.
  module_state add_engine(torch::nn::Module& module, comm::process_group& group, const fsdp_options& options);

  // fabric.init_module(true) under `options` on the world: FULL_SHARD and
  // HYBRID_SHARD over more than one rank shard each loom::unit<M> as it is
  // built (HYBRID_SHARD's setup gathers each unit once and shards it over
  // its shard group); SHARD_GRAD_OP and NO_SHARD keep whole parameters after
  // setup, so construction builds them whole.
  std::optional<detail::construction_sharding> construction_sharding_of(const fsdp_options& options) const;

  // Full: each parameter and optimizer state tensor gathered to rank 0 as its
  // record is written, then dropped; one file any strategy loads. Sharded: a
  // directory, each rank's file holding its shards keyed by parameter name,
  // meta.pt written last. A filter is refused for sharded saves (as
  // Lightning's, pytorch#105379): `to_filter` says which option saves full.
  void save_full_or_sharded(bool full, std::string_view strategy, std::string_view to_filter, const std::string& path,
                            const state& checkpoint, const state_filter& filter, const checkpoint_metadata& metadata);

  // Runs body with every live engine's parameters (and the checkpoint's
  // optimizers' state) full-sized.
  template <class Body>
  void with_full_state(const state& checkpoint, int root, Body&& body) {
    detail::with_full_state(engines_.entries(), checkpoint.modules(), checkpoint.optimizers(),
                            /*keeps=*/root < 0 || root == global_rank(), body);
  }

  precision_dtypes precision_;
  detail::live_engines<detail::fsdp_engine> engines_;
};

}  // namespace loom
