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
#include <loom/strategy/fsdp_options.hpp>
#include <loom/strategy/sharded_parallel.hpp>
#include <loom/strategy/unit_construction.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
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

struct model_parallel : sharded_parallel {
  static constexpr std::string_view name = "model_parallel";
  static constexpr bool supports_no_backward_sync = true;
  // Its parameters live in shards (is_sharded, from sharded_parallel): the
  // sharded strategies' precisions (32-true, bf16-mixed, bf16-true; 16-true
  // on cuda), as Lightning's list. Its module_state, the sharding engine over
  // the data-parallel dimension, is null when that has one rank.

  model_parallel() = default;
  explicit model_parallel(model_parallel_options options)
      : sharded_parallel(options.process),
        options_(std::move(options)) {}

  void setup_environment(const strategy_environment& environment) {
    sharded_parallel::setup_environment(environment);
    num_nodes_ = environment.num_nodes;
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
    return detail::construction_sharding{&world_group(), options_.data_parallel.sync_module_states};
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
    if (move_to_device) detail::move_module(module, this->device_);
    options_.parallelize_fn(module, mesh);
    // Units built under init_module(true) are gathered one at a time as the
    // engine (or, on one data-parallel rank, this) reaches them, each
    // parameter keeping its tensor-parallel chunk.
    detail::note_tensor_parallel_chunks(module);
    if (mesh.size("data_parallel") == 1) {
      detail::gather_all_constructed(module);
      return nullptr;
    }
    return add_engine(module, mesh.group("data_parallel"), options_.data_parallel);
  }

  // forward, no_backward_sync (tensor parallel has nothing to skip; the
  // data-parallel engine defers its reduction), zero_grad, clip_gradients
  // (chunks summed over the tensor-parallel group, the engine's slices over
  // the data-parallel one, replicas counted once) and load_checkpoint are
  // every sharded strategy's (sharded_parallel.hpp).

  // ------------------------------------------------------------ checkpoints
  // Distributed (sharded) or full; loaded on any mesh (or from single_device,
  // ddp, fsdp) by sharded_parallel::load_checkpoint.
  void save_checkpoint(const std::string& path, const state& checkpoint, const state_filter& filter,
                       const checkpoint_metadata& metadata) {
    save_full_or_sharded(!options_.save_distributed_checkpoint, name, "set save_distributed_checkpoint=false", path,
                         checkpoint, filter, metadata);
  }
  // What the next fabric.save writes.
  void set_save_distributed_checkpoint(bool distributed) noexcept { options_.save_distributed_checkpoint = distributed; }

  const model_parallel_options& options() const noexcept { return options_; }

 private:
  model_parallel_options options_;
  int num_nodes_ = 1;
  std::shared_ptr<comm::device_mesh> mesh_;
};

static_assert(Strategy<model_parallel>);

}  // namespace loom
