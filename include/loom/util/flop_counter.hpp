// FLOP counting at the operator level (Lightning's measure_flops; PyTorch's
// FlopCounterMode needs torch >= 2.1 and Python). C++ modules have no forward
// hooks, so loom listens to LibTorch's RecordFunction callbacks on the calling
// thread (autograd carries them into backward) and counts, from the input
// shapes, the matrix products and convolutions FlopCounterMode counts:
// mm, addmm, bmm, baddbmm (2*m*n*k per product), convolution and its
// backward (2 * batch * |weight| * output positions, per computed gradient)
// and the fused attention kernels of LibTorch 2.x. Products inside a counted
// operator (matmul -> mm, conv -> its kernel) are counted once, at the
// outermost. Bias additions, activations and reductions are not counted.
#pragma once

#include <loom/util/module_holder.hpp>

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

namespace loom {

struct flop_count {
  double forward = 0;
  double backward = 0;
  std::map<std::string, double> by_operator;  // "aten::mm" -> flops, forward and backward together
  double total() const noexcept { return forward + backward; }
};

// Counts while alive, on this thread (and the autograd work it starts).
// Operators run before mark_backward() count as forward, after it as backward.
class flop_counter {
 public:
  flop_counter();
  ~flop_counter();
  flop_counter(const flop_counter&) = delete;
  flop_counter& operator=(const flop_counter&) = delete;

  void mark_backward() noexcept;
  const flop_count& counts() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// Lightning's measure_flops(model, forward_fn, loss_fn): the flops of
// forward_fn() and, with loss_fn, of loss_fn(output).backward(). The work
// really runs (LibTorch 1.13 has no meta-device modules); module's gradients
// are put back as they were before.
flop_count measure_flops(torch::nn::Module& module, const std::function<at::Tensor()>& forward_fn,
                         const std::function<at::Tensor(const at::Tensor&)>& loss_fn = nullptr);

// measure_flops(model, input): module->forward(input), then the backward of
// its sum; the module's gradients are as they were before.
template <ModuleHolder Holder, class Input>
flop_count measure_flops(Holder& module, const Input& input) {
  return measure_flops(
      *module, [&module, &input]() -> at::Tensor { return module->forward(input); },
      [](const at::Tensor& output) { return output.sum(); });
}

}  // namespace loom
