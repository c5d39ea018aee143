// model_parallel's compiled parts: the mesh's sizes, clipping over shards and
// the distributed checkpoint's layout.
#include <loom/strategy/model_parallel.hpp>

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
  const double p_norm = options.norm_type;
  const bool infinity = std::isinf(p_norm);
  // Sharded parameters: each rank's part of the sum (or max) over the group;
  // replicated ones: the same on every rank, counted once. Under a
  // data-parallel engine each gradient is this rank's slice of it.
  double sharded_part = 0, replicated_part = 0;
  for (const auto& p : parameters) {
    if (p.grad().numel() == 0) continue;
    const at::Tensor g = p.grad().detach().to(at::kDouble);
    const double value = infinity ? g.abs().max().item<double>() : g.abs().pow(p_norm).sum().item<double>();
    double& part = sharded.count(p.unsafeGetTensorImpl()) ? sharded_part : replicated_part;
    part = infinity ? std::max(part, value) : part + value;
  }
  const reduce_op op = infinity ? reduce_op::max : reduce_op::sum;
  // On the groups' device (what NCCL reduces); the parts above were read to the CPU.
  at::Tensor parts =
      at::tensor({sharded_part, replicated_part}, at::TensorOptions().dtype(at::kDouble).device(tensor_group.device()));
  if (data_group != nullptr) {
    comm::process_group data = *data_group;
    data.all_reduce(parts, op);
  }
  at::Tensor total = parts.narrow(0, 0, 1).clone();
  comm::process_group group = tensor_group;
  group.all_reduce(total, op);
  const double replicated = parts[1].item<double>();
  const double combined = infinity ? std::max(total.item<double>(), replicated) : total.item<double>() + replicated;
  const double norm = infinity ? combined : std::pow(combined, 1.0 / p_norm);
  if (options.error_if_nonfinite && !std::isfinite(norm)) {
    throw configuration_error("clip_gradients: the total norm of the gradients is " + std::to_string(norm) +
                              " (error_if_nonfinite is set)");
  }
  const double coefficient = *options.max_norm / (norm + 1e-6);
  if (coefficient < 1.0) {
    torch::NoGradGuard no_grad;
    for (auto& p : parameters) p.grad().mul_(coefficient);
  }
  return norm;
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
