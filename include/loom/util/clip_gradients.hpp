// The clipping half of Fabric.clip_gradients (the precision unscales first).
// Compiled in src/util/clip_gradients.cpp: a TU that includes this header
// does not parse LibTorch's clip_grad.h.
#pragma once

#include <loom/util/clip_options.hpp>
#include <loom/util/module_fwd.hpp>

#include <ATen/core/Tensor.h>

#include <optional>
#include <vector>

namespace loom::detail {

// Refuses options that clip by both value and norm, or by neither.
void check_clip_options(const clip_options& options);

// Clips by value, or by norm and returns the total norm.
std::optional<double> clip_gradient_values(std::vector<at::Tensor> parameters, const clip_options& options);
// The same over a module's parameters.
std::optional<double> clip_gradient_values(torch::nn::Module& module, const clip_options& options);

}  // namespace loom::detail
