// Lightning's ModelParallelStrategy ("model_parallel"): a 2-D mesh of
// data_parallel x tensor_parallel ranks, and the user's parallelize_fn(module,
// mesh), called at setup, applies tensor parallelism (loom::tp's
// parallelize_module over the mesh's "tensor_parallel" dimension). Samplers
// use the data-parallel coordinate: the ranks of one tensor-parallel group
// see the same batch.
//
// Built so far: the mesh, parallelize_fn, tensor parallel (data_parallel_size
// 1), samplers, gradient clipping over shards. Not built yet (an error says
// so): data_parallel_size > 1 (FSDP on the data-parallel dimension),
// distributed checkpoints.
#pragma once

#include <loom/comm/device_mesh.hpp>
#include <loom/strategy/parallel.hpp>
#include <loom/tp/parallelize.hpp>

#include <chrono>
#include <cstdint>
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
  comm::backend process_group_backend = comm::backend::gloo;
  std::chrono::milliseconds timeout = std::chrono::minutes(30);
  launcher_kind launcher = launcher_kind::subprocess;
  std::optional<std::int64_t> mpi_communicator;
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(300);
};

namespace detail {
// The mesh's sizes from the options and the job ("auto" resolved); a
// configuration_error naming the three numbers when they do not multiply.
std::pair<int, int> model_parallel_sizes(int data_parallel, int tensor_parallel, int world_size, int num_nodes);
// Total gradient norm over a tensor-parallel model: sharded parameters
// summed over the group, replicated ones counted once. Clips in place.
std::optional<double> clip_tensor_parallel(torch::nn::Module& module, const comm::process_group& tensor_group,
                                           const clip_options& options);
}  // namespace detail

struct model_parallel : parallel {
  static constexpr std::string_view name = "model_parallel";
  static constexpr bool supports_no_backward_sync = true;

  model_parallel() = default;
  explicit model_parallel(model_parallel_options options)
      : parallel(parallel_options{.timeout = options.timeout,
                                  .backend = options.process_group_backend,
                                  .launcher = options.launcher,
                                  .mpi_communicator = options.mpi_communicator,
                                  .collective_timeout = options.collective_timeout}),
        options_(std::move(options)) {}

  void setup_environment(const strategy_environment& environment) {
    parallel::setup_environment(environment);
    num_nodes_ = environment.num_nodes;
  }

  // The 2-D mesh (data_parallel, tensor_parallel), formed on first use
  // (collective over the world).
  comm::device_mesh& device_mesh() {
    if (!mesh_) {
      const auto [dp, tp] = detail::model_parallel_sizes(options_.data_parallel_size, options_.tensor_parallel_size,
                                                         world_size(), num_nodes_);
      if (dp > 1) {
        throw configuration_error("model_parallel: data_parallel_size " + std::to_string(dp) +
                                  " (FSDP on the data-parallel dimension) is not built yet; run tensor parallel "
                                  "alone (data_parallel_size 1, tensor_parallel_size = the world size)");
      }
      mesh_ = std::make_shared<comm::device_mesh>(group(), std::vector<int>{dp, tp},
                                                  std::vector<std::string>{"data_parallel", "tensor_parallel"});
    }
    return *mesh_;
  }

  // Samplers read the data-parallel coordinate.
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
    return {};
  }

  template <class State>
  std::optional<double> clip_gradients(State& /*state*/, torch::nn::Module& module, const clip_options& options) {
    return detail::clip_tensor_parallel(module, device_mesh().group("tensor_parallel"), options);
  }

  const model_parallel_options& options() const noexcept { return options_; }

 private:
  model_parallel_options options_;
  int num_nodes_ = 1;
  std::shared_ptr<comm::device_mesh> mesh_;
};

static_assert(Strategy<model_parallel>);

}  // namespace loom
