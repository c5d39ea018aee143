// The found-inf check (include/loom/util/unscale_gradients.hpp).
#include <loom/util/unscale_gradients.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

namespace loom::detail {

void unscale_and_find_nonfinite(std::vector<at::Tensor>& gradients, at::Tensor& found_inf,
                                const at::Tensor& inverse_scale) {
  if (gradients.empty()) return;
  at::NoGradGuard no_grad;
  const c10::Device device = gradients.front().device();
  if (device.is_cuda() && found_inf.device() == device && inverse_scale.device() == device) {
    at::_amp_foreach_non_finite_check_and_unscale_(gradients, found_inf, inverse_scale);
    return;
  }
  // The check looks at the scaled values, as the fused kernel does; then
  // every gradient is multiplied, finite or not. The flag is gathered where
  // the gradients are and added to found_inf once (which may live on a
  // communication device: ZeRO's is on its group's).
  at::Tensor found_here = at::zeros({1}, found_inf.options().device(device));
  for (auto& gradient : gradients) {
    found_here.logical_or_(at::isfinite(gradient).all().logical_not().to(device));
    gradient.mul_(inverse_scale.to(gradient.device()));
  }
  found_inf.add_(found_here.to(found_inf.device()));
}

}  // namespace loom::detail
