// Dynamic loss scaling for fp16 mixed precision (torch.amp.GradScaler's
// semantics). LibTorch C++ has no GradScaler and its _amp_* kernels are
// CUDA-only, so CPU tensors take a path built from ordinary ops.
#pragma once

#include <loom/concepts.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace loom {

struct grad_scaler_options {
  double init_scale = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  std::int64_t growth_interval = 2000;
  bool enabled = true;
};

class grad_scaler {
 public:
  explicit grad_scaler(grad_scaler_options options = {});

  // loss * scale. The scale lives on the loss's device from the first call.
  at::Tensor scale(const at::Tensor& loss);

  // Divides the gradients of optimizer's parameters by the scale, in place,
  // and records whether any was inf or nan. At most once per step.
  void unscale_(torch::optim::Optimizer& optimizer, optimizer_slot slot);

  // Unscales if not done yet, then runs optimizer.step() unless a gradient
  // was not finite. Returns whether the step ran.
  bool step(torch::optim::Optimizer& optimizer, optimizer_slot slot);

  // Backs off the scale after a skipped step; grows it after growth_interval
  // finite steps in a row.
  void update();

  bool is_enabled() const noexcept { return options_.enabled; }
  double get_scale() const;
  std::int64_t growth_tracker() const;
  const grad_scaler_options& options() const noexcept { return options_; }

  // torch's keys: scale, growth_factor, backoff_factor, growth_interval, _growth_tracker.
  c10::IValue state_dict() const;
  // Validates every key before changing anything.
  void load_state_dict(const c10::IValue& state);

 private:
  enum class stage : std::uint8_t { ready, unscaled, stepped };
  struct optimizer_state {
    stage current = stage::ready;
    at::Tensor found_inf;  // float, shape [1], on the scale's device
  };

  optimizer_state& state_for(optimizer_slot slot);
  void lazy_init(const c10::Device& device);

  grad_scaler_options options_;
  at::Tensor scale_;           // float [1]
  at::Tensor growth_tracker_;  // int32 [1]
  std::vector<optimizer_state> optimizers_;
};

}  // namespace loom
