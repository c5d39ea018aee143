// The found-inf check (include/loom/util/unscale_gradients.hpp).
#include <loom/util/unscale_gradients.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace loom::detail {

void unscale_and_find_nonfinite(std::vector<at::Tensor>& gradients, at::Tensor& found_inf,
                                const at::Tensor& inverse_scale) {
  if (gradients.empty()) return;
  at::NoGradGuard no_grad;
  if (gradients.front().is_cuda() && found_inf.device() == gradients.front().device()) {
    at::_amp_foreach_non_finite_check_and_unscale_(gradients, found_inf, inverse_scale.to(found_inf.device()));
    return;
  }
  // The check looks at the scaled values, as the fused kernel does; then
  // every gradient is multiplied, finite or not.
  for (auto& gradient : gradients) {
    found_inf.logical_or_(at::isfinite(gradient).all().logical_not().to(found_inf.device()));
    gradient.mul_(inverse_scale.to(gradient.device()));
  }
}

}  // namespace loom::detail
