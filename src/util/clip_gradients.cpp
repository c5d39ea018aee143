// Fabric.clip_gradients' clipping (include/loom/util/clip_gradients.hpp).
#include <loom/util/clip_gradients.hpp>

#include <loom/errors.hpp>

// clip_grad.h uses torch::Tensor without including what declares it.
#include <torch/types.h>
#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>

namespace loom::detail {

void check_clip_options(const clip_options& options) {
  if (options.clip_val.has_value() == options.max_norm.has_value()) {
    throw configuration_error(options.clip_val ? "clip_gradients: clip by value or by norm, not both"
                                               : "clip_gradients: give clip_val or max_norm");
  }
}

std::optional<double> clip_gradient_values(std::vector<at::Tensor> parameters, const clip_options& options) {
  if (options.clip_val) {
    torch::nn::utils::clip_grad_value_(parameters, *options.clip_val);
    return std::nullopt;
  }
  return torch::nn::utils::clip_grad_norm_(parameters, *options.max_norm, options.norm_type,
                                           options.error_if_nonfinite);
}

std::optional<double> clip_gradient_values(torch::nn::Module& module, const clip_options& options) {
  return clip_gradient_values(module.parameters(), options);
}

}  // namespace loom::detail
