#include <loom/util/module_fwd.hpp>

#include <torch/nn/module.h>

namespace loom::detail {

void move_module(torch::nn::Module& module, c10::Device device) { module.to(device); }

}  // namespace loom::detail
