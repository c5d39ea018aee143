// model_parallel's compiled parts: the mesh's sizes and clipping over shards.
#include <loom/strategy/model_parallel.hpp>

#include <ATen/ATen.h>

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
                                           const clip_options& options) {
  std::vector<at::Tensor> parameters;
  for (const auto& p : module.parameters()) {
    if (p.grad().defined()) parameters.push_back(p);
  }
  if (options.clip_val) {
    // Elementwise: the same on a shard as on the whole.
    return clip_gradient_values(parameters, options);
  }
  std::unordered_set<const void*> sharded;
  for (auto* layer : tp::parallelized_layers(module)) {
    for (const auto& p : layer->sharded_parameters()) sharded.insert(p.unsafeGetTensorImpl());
  }
  const double p_norm = options.norm_type;
  const bool infinity = std::isinf(p_norm);
  // Sharded parameters: each rank's part of the sum (or max) over the group;
  // replicated ones: the same on every rank, counted once.
  double sharded_part = 0, replicated_part = 0;
  for (const auto& p : parameters) {
    const at::Tensor g = p.grad().detach().to(at::kDouble);
    const double value = infinity ? g.abs().max().item<double>() : g.abs().pow(p_norm).sum().item<double>();
    double& part = sharded.count(p.unsafeGetTensorImpl()) ? sharded_part : replicated_part;
    part = infinity ? std::max(part, value) : part + value;
  }
  comm::process_group group = tensor_group;
  at::Tensor total = at::full({1}, sharded_part, at::kDouble);
  group.all_reduce(total, infinity ? reduce_op::max : reduce_op::sum);
  const double combined =
      infinity ? std::max(total.item<double>(), replicated_part) : total.item<double>() + replicated_part;
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

}  // namespace loom::detail
