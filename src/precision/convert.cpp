#include <loom/precision/convert.hpp>

#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>

namespace loom {

void convert_module_floating(torch::nn::Module& module, c10::ScalarType dtype) {
  at::NoGradGuard no_grad;
  for (auto& parameter : module.parameters(/*recurse=*/true)) {
    if (parameter.is_floating_point() && parameter.scalar_type() != dtype) parameter.set_data(parameter.to(dtype));
  }
  for (auto& buffer : module.buffers(/*recurse=*/true)) {
    if (buffer.is_floating_point() && buffer.scalar_type() != dtype) buffer.set_data(buffer.to(dtype));
  }
}

}  // namespace loom
