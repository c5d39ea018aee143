// Identity defaults for a Precision: nothing converted, no forward context,
// plain backward and step. Inherit it and hide what your precision changes.
#pragma once

#include <loom/concepts.hpp>
#include <loom/util/no_context.hpp>

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>

namespace loom {

struct precision_base {
  using loom_concept = precision_tag;
  static constexpr bool is_mixed = false;
  static constexpr bool has_state = false;
  // Whether inputs and outputs of the wrapped module's forward are converted;
  // when false, loom skips convert_input/convert_output at compile time.
  static constexpr bool converts_io = false;

  void convert_module(torch::nn::Module& /*module*/) {}
  at::Tensor convert_input(const at::Tensor& tensor) const { return tensor; }
  at::Tensor convert_output(const at::Tensor& tensor) const { return tensor; }
  no_context forward_context(c10::DeviceType /*device*/) const { return {}; }
  // The dtype modules are created in under init_module().
  no_context init_context() const { return {}; }
  void backward(const at::Tensor& loss) { loss.backward(); }
  void optimizer_step(torch::optim::Optimizer& optimizer, optimizer_slot /*slot*/) { optimizer.step(); }
  void unscale_gradients(torch::optim::Optimizer& /*optimizer*/, optimizer_slot /*slot*/) {}
};

}  // namespace loom
