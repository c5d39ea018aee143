// DeepSpeed's fp16 loss scaler (deepspeed/runtime/fp16/loss_scaler.py,
// DynamicLossScaler), for ZeRO under 16-mixed: the loss is multiplied by the
// scale; a boundary whose gradients hold an inf or nan on any rank skips the
// step; hysteresis overflows in a row halve the scale (never below
// min_loss_scale); loss_scale_window clean steps since the last overflow
// double it. loss_scale > 0 is a static scale. Not torch's GradScaler (whose
// backoff is immediate and whose growth counter restarts differently).
#pragma once

#include <loom/comm/process_group.hpp>
#include <loom/strategy/zero_loss_scaling.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>

namespace torch::optim {
class Optimizer;
}

namespace loom {

class zero_loss_scaler {
 public:
  explicit zero_loss_scaler(const zero_loss_scaling& config = {});

  double scale() const noexcept { return scale_; }
  bool dynamic() const noexcept { return dynamic_; }
  std::int64_t hysteresis_left() const noexcept { return hysteresis_left_; }
  std::int64_t iteration() const noexcept { return iteration_; }

  at::Tensor scale_loss(const at::Tensor& loss) const;

  // DeepSpeed's update_scale: after each boundary, whether it overflowed.
  void update(bool overflow);

  // Divides the gradients of optimizer's parameters by the scale and says
  // whether any rank (group, when valid) saw an inf or nan; then steps the
  // optimizer unless one did, and updates the scale. Returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer, comm::process_group* group = nullptr);
  bool unscale_and_check(torch::optim::Optimizer& optimizer, comm::process_group* group = nullptr);

  // DeepSpeed's names: cur_scale, cur_iter, last_overflow_iter, cur_hysteresis.
  c10::IValue state_dict() const;
  void load_state_dict(const c10::IValue& state);

 private:
  bool dynamic_ = true;
  double scale_ = 65536.0;
  double min_scale_ = 1.0;
  std::int64_t window_ = 1000;
  std::int64_t hysteresis_ = 2;
  std::int64_t hysteresis_left_ = 2;
  std::int64_t iteration_ = 0;
  std::int64_t last_overflow_ = -1;
};

}  // namespace loom
