// model_parallel's compiled parts: the mesh's sizes, clipping over shards and
// the distributed checkpoint's layout.
#include <loom/strategy/model_parallel.hpp>
#include <loom/strategy/gradient_norm.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <unordered_set>

namespace loom::detail {

std::pair<int, int> model_parallel_sizes(int data_parallel, int tensor_parallel, int world_size, int num_nodes) {
  const int dp = data_parallel > 0 ? data_parallel : num_nodes;
  const int tp = tensor_parallel > 0 ? tensor_parallel : world_size / std::max(num_nodes, 1);
  if (dp * tp != world_size) {
    throw configuration_error("model_parallel: data_parallel_size " + std::to_string(dp) + " x tensor_parallel_size " +
                              std::to_string(tp) + " = " + std::to_string(dp * tp) + " ranks, but the world size is " +
                              std::to_string(world_size) + "; the two must multiply to the world size");
  }
  return {dp, tp};
}

std::optional<double> clip_tensor_parallel(torch::nn::Module& module, const comm::process_group& tensor_group,
                                           const comm::process_group* data_group, const clip_options& options) {
  std::vector<at::Tensor> parameters;
  for (const auto& p : module.parameters()) {
    if (p.grad().defined()) parameters.push_back(p);
  }
  if (options.clip_val) {
    // Elementwise: the same on a shard as on the whole.
    return clip_gradient_values(parameters, options);
  }
  std::unordered_set<const void*> sharded;
  for (const auto& chunk : tp::sharded_parameters_of(module)) sharded.insert(chunk.parameter.unsafeGetTensorImpl());
  // Sharded parameters: each rank holds a slice over the tensor group;
  // replicated ones are whole on every rank, counted once. Under a
  // data-parallel engine each gradient is also this rank's slice over the
  // data group.
  gradient_norm slices(options.norm_type, tensor_group.device());
  gradient_norm replicated(options.norm_type, tensor_group.device());
  for (const auto& p : parameters) (sharded.count(p.unsafeGetTensorImpl()) ? slices : replicated).add(p.grad());
  if (data_group != nullptr) {
    slices.reduce_over(*data_group);
    replicated.reduce_over(*data_group);
  }
  slices.reduce_over(tensor_group);
  slices.add(replicated);
  std::vector<at::Tensor> gradients;
  for (const auto& p : parameters) gradients.push_back(p.grad());
  return clip_to_max_norm(slices, gradients, options);
}

shard_layout model_parallel_layout(const state& checkpoint, const std::vector<std::weak_ptr<fsdp_engine>>& engines,
                                   const comm::process_group& tensor_group) {
  shard_layout layout = sharded_save_layout(checkpoint, engines, "model_parallel");
  const int parts = tensor_group.size();
  for (const torch::nn::Module* module : checkpoint.modules()) {
    for (const auto& chunk : tp::sharded_parameters_of(*module)) {
      auto found = layout.find(chunk.name);
      if (found == layout.end()) {
        // Not sliced by an engine: the whole chunk.
        found = layout.emplace(chunk.name, shard_range{0, chunk.parameter.numel(), chunk.parameter.sizes().vec()}).first;
      }
      shard_range& range = found->second;
      range.dim = chunk.dim;
      range.part = tensor_group.rank();
      range.parts = parts;
      range.shape[static_cast<std::size_t>(chunk.dim)] *= parts;
    }
  }
  return layout;
}

}  // namespace loom::detail
