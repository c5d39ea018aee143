// Lightning's ModelParallelStrategy ("model_parallel"): a 2-D mesh of
// data_parallel x tensor_parallel ranks, and the user's parallelize_fn(module,
// mesh), called at setup, applies tensor parallelism (loom::tp's
// parallelize_module over the mesh's "tensor_parallel" dimension). Samplers
// use the data-parallel coordinate: the ranks of one tensor-parallel group
// see the same batch. (loom::tp is in <loom/tp/parallelize.hpp>, which the
// parallelize_fn's TU includes; this header does not need it.)
//
// The data-parallel dimension is sharded by the FSDP engine (fsdp_engine.hpp)
// on the mesh's data_parallel groups, FSDP2's role: each rank's
// tensor-parallel shards are sharded again over the ranks that share its
// tensor-parallel coordinate, and their gradients averaged over them.
//
// Checkpoints: distributed (save_distributed_checkpoint, the default) is a
// sharded checkpoint directory in which each rank's file holds its
// tensor-parallel chunks, sliced again by the data-parallel engine, each
// named by its chunk (dimension, part, parts) and range; `loom-run
// consolidate` and any strategy's load reassemble the full tensors. Full: the
// chunks (and the optimizers' state of them) gathered over both dimensions,
// one file written by rank 0 that single_device loads.
#pragma once

#include <loom/comm/device_mesh.hpp>
#include <loom/compat.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/full_state.hpp>
#include <loom/strategy/live_engines.hpp>
#include <loom/strategy/no_sync_guard.hpp>
#include <loom/strategy/parallel.hpp>
#include <loom/strategy/unit_construction.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

namespace loom {

struct model_parallel_options {
  // Applies tensor parallelism to the module in place (Lightning's returns
  // the module; here fabric.setup keeps the one it was given).
  std::function<void(torch::nn::Module&, comm::device_mesh&)> parallelize_fn;
  int data_parallel_size = 0;    // 0: "auto", the number of nodes
  int tensor_parallel_size = 0;  // 0: "auto", the processes per node
  bool save_distributed_checkpoint = true;
  // How the data-parallel dimension is sharded (units, sharding strategy,
  // prefetch, ...): fsdp's options, on the data_parallel groups (their
  // `process` is not read: the strategy's own below is).
  fsdp_options data_parallel;
  // The processes it runs on (timeout, backend, launcher, MPI communicator,
  // watchdog), as every distributed strategy takes them.
  process_options process;
};

namespace detail {
// The mesh's sizes from the options and the job ("auto" resolved); a
// configuration_error naming the three numbers when they do not multiply.
std::pair<int, int> model_parallel_sizes(int data_parallel, int tensor_parallel, int world_size, int num_nodes);
}  // namespace detail

struct model_parallel : parallel {
  static constexpr std::string_view name = "model_parallel";
  static constexpr bool supports_no_backward_sync = true;
  // Its parameters live in shards: the sharded strategies' precisions
  // (32-true, bf16-mixed, bf16-true; 16-true on cuda), as Lightning's list.
  static constexpr bool is_sharded = true;

  // The sharding engine over the data-parallel dimension (null when it has one rank).
  using module_state = std::shared_ptr<detail::fsdp_engine>;

  model_parallel() = default;
  explicit model_parallel(model_parallel_options options)
      : parallel(options.process),
        options_(std::move(options)) {}

  void setup_environment(const strategy_environment& environment) {
    parallel::setup_environment(environment);
    num_nodes_ = environment.num_nodes;
    precision_ = environment.precision;
  }

  // The 2-D mesh (data_parallel, tensor_parallel), formed on first use
  // (collective over the world).
  comm::device_mesh& device_mesh() {
    if (!mesh_) {
      const auto [dp, tp] = detail::model_parallel_sizes(options_.data_parallel_size, options_.tensor_parallel_size,
                                                         world_size(), num_nodes_);
      mesh_ = std::make_shared<comm::device_mesh>(group(), std::vector<int>{dp, tp},
                                                  std::vector<std::string>{"data_parallel", "tensor_parallel"});
    }
    return *mesh_;
  }

  // fabric.init_module(true): each loom::unit<M> keeps its shard of the
  // world from its constructor on (unit_construction.hpp); setup gathers
  // each unit once, as it reaches it, keeps this rank's tensor-parallel
  // chunks and shards them over the data-parallel group. Tensor-parallel
  // layers outside any unit are built whole until parallelize_fn slices them.
  std::optional<detail::construction_sharding> construction_sharding() const {
    if (world_size() < 2) return std::nullopt;
    return detail::construction_sharding{&runtime_pointer()->group(), options_.data_parallel.sync_module_states};
  }

  // Samplers read the data-parallel coordinate.
  static constexpr bool sets_sampler_ranks = true;
  int sampler_replicas() { return device_mesh().size("data_parallel"); }
  int sampler_rank() { return device_mesh().coordinate("data_parallel"); }

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true) {
    if (!options_.parallelize_fn) {
      throw configuration_error("model_parallel: parallelize_fn is empty; give the function that applies tensor "
                                "parallelism to the module (loom::tp::parallelize_module with a plan)");
    }
    comm::device_mesh& mesh = device_mesh();
    if (move_to_device) module.to(this->device_);
    options_.parallelize_fn(module, mesh);
    // Units built under init_module(true) are gathered one at a time as the
    // engine (or, on one data-parallel rank, this) reaches them, each
    // parameter keeping its tensor-parallel chunk.
    detail::note_tensor_parallel_chunks(module);
    if (mesh.size("data_parallel") == 1) {
      detail::gather_all_constructed(module);
      return nullptr;
    }
    auto engine = std::make_shared<detail::fsdp_engine>(module, mesh.group("data_parallel"), options_.data_parallel,
                                                        runtime().local_world_size(), precision_);
    engines_.add(engine);
    return engine;
  }

  template <class Forward>
  auto forward(module_state& engine, torch::nn::Module& /*module*/, Forward&& run) {
    if (!engine) return std::forward<Forward>(run)();
    return detail::forward_through(*engine, std::forward<Forward>(run));
  }

  // Tensor parallel has nothing to skip; the data-parallel engine defers its
  // reduction (FSDP's no_sync).
  class [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] no_sync {
   public:
    no_sync(detail::fsdp_engine* engine, bool enabled) {
      if (engine != nullptr) guard_.emplace(*engine, enabled);
    }

   private:
    std::optional<no_sync_guard<detail::fsdp_engine>> guard_;
  };
  no_sync no_backward_sync(module_state& engine, bool enabled = true) { return no_sync(engine.get(), enabled); }

  // As asked, as fsdp (its engine may run on the data-parallel dimension).
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) { compat::zero_grad(optimizer, set_to_none); }

  template <class State>
  std::optional<double> clip_gradients(State& engine, torch::nn::Module& module, const clip_options& options) {
    // Over the placements: chunks summed over the tensor-parallel group,
    // the engine's slices over the data-parallel one, replicas counted once.
    std::vector<std::weak_ptr<detail::fsdp_engine>> engines;
    if (engine) engines.push_back(engine);
    return detail::clip_placed(detail::placements_of(engines, {&module}), options);
  }

  // ------------------------------------------------------------ checkpoints
  void save_checkpoint(const std::string& path, const state& checkpoint, const state_filter& filter,
                       const checkpoint_metadata& metadata) {
    if (!options_.save_distributed_checkpoint) {
      detail::save_gathered_state(engines_.entries(), checkpoint, filter, metadata, path, /*root=*/0, group());
      barrier();
      return;
    }
    if (!filter.empty()) {
      throw configuration_error("model_parallel: a filter is refused for distributed saves (as fsdp's sharded "
                                "ones); set save_distributed_checkpoint=false to filter a full save");
    }
    loom::save_sharded_checkpoint(path, checkpoint, metadata,
                                  detail::sharded_save_layout(checkpoint, engines_.entries(), "model_parallel"), group());
  }
  // Full or distributed, written on any mesh (or by single_device, ddp,
  // fsdp): each rank reads only its chunks and slices, in place
  // (load_local_parts), and all ranks load or none.
  state load_checkpoint(const std::string& path, const state& checkpoint, bool strict) {
    return detail::load_local_state(engines_.entries(), checkpoint, path, strict, group());
  }
  // What the next fabric.save writes.
  void set_save_distributed_checkpoint(bool distributed) noexcept { options_.save_distributed_checkpoint = distributed; }

  const model_parallel_options& options() const noexcept { return options_; }

 private:
  model_parallel_options options_;
  detail::live_engines<detail::fsdp_engine> engines_;
  int num_nodes_ = 1;
  precision_dtypes precision_;
  std::shared_ptr<comm::device_mesh> mesh_;
};

static_assert(Strategy<model_parallel>);

}  // namespace loom
