// Dtype conversion of floating-point tensors and of a module's floating
// parameters and buffers (integer buffers such as step counters stay as they
// are, unlike LibTorch's Module::to(dtype)).
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace torch::nn {
class Module;
}

namespace loom {

inline at::Tensor convert_floating(const at::Tensor& tensor, c10::ScalarType dtype) {
  if (tensor.defined() && tensor.is_floating_point() && tensor.scalar_type() != dtype) return tensor.to(dtype);
  return tensor;
}

// Converts the floating parameters and buffers of module (recursively) to dtype, in place.
void convert_module_floating(torch::nn::Module& module, c10::ScalarType dtype);

}  // namespace loom
