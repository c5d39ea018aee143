// LibTorch's module classes, declared only, and what loom's headers do to a
// module out of line. <torch/nn/module.h> brings TorchScript's module and
// the serialization archives (about a second of every TU that includes it,
// measured against <loom/loom.hpp>), and loom's headers need a module only by
// reference: the user's own model code includes the definition anyway. Both
// declarations are the same in LibTorch 1.13 and 2.x.
#pragma once

#include <c10/core/Device.h>

namespace torch::nn {
class Module;
template <typename Contained>
class ModuleHolder;
}  // namespace torch::nn

namespace loom::detail {

// module.to(device), compiled in src/util/module_device.cpp.
void move_module(torch::nn::Module& module, c10::Device device);

}  // namespace loom::detail
