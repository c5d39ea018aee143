// The found-inf check, written once for the precision plugin's GradScaler
// and ZeRO's loss scaler: every gradient is multiplied by inverse_scale,
// and found_inf (float, shape [1], zero on entry) becomes 1 when any held a
// non-finite value before it, as torch's
// _amp_foreach_non_finite_check_and_unscale_ (the fused kernel on CUDA, the
// same rule elsewhere). found_inf may live on another device than the
// gradients (a group's); nothing waits on the host: the caller reads or
// reduces found_inf.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace loom::detail {

void unscale_and_find_nonfinite(std::vector<at::Tensor>& gradients, at::Tensor& found_inf,
                                const at::Tensor& inverse_scale);

}  // namespace loom::detail
