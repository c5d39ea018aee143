// What setup returns for an optimizer: the user's optimizer, whose step runs
// through a stepper (the strategy and the precision; for 16-mixed: unscale,
// skip on inf, rescale). The static stepper is wrap/strategy_session.hpp's,
// the erased one runtime/erased_backend.hpp's.
#pragma once

#include <loom/compat.hpp>
#include <loom/concepts/base.hpp>

#include <torch/optim/optimizer.h>

#include <concepts>

namespace loom {

// Stepper: void step(torch::optim::Optimizer&, optimizer_slot);
//          void zero_grad(torch::optim::Optimizer&, bool set_to_none);
template <class O, class Stepper>
  requires std::derived_from<O, torch::optim::Optimizer>
class wrapped_optimizer {
 public:
  using optimizer_type = O;

  wrapped_optimizer(O& optimizer, Stepper stepper, optimizer_slot slot)
      : optimizer_(&optimizer), stepper_(stepper), slot_(slot) {}

  void step() { stepper_.step(*optimizer_, slot_); }

  // Both go through the strategy, which may keep gradients (DeepSpeed between
  // accumulation boundaries) or zero them its own way (DDP's bucket views).
  // LibTorch's default: zero in place on 1.13, set to none on 2.x.
  void zero_grad() { stepper_.zero_grad(*optimizer_, compat::zero_grad_sets_to_none); }
  void zero_grad(bool set_to_none) { stepper_.zero_grad(*optimizer_, set_to_none); }

  O& optimizer() noexcept { return *optimizer_; }
  const O& optimizer() const noexcept { return *optimizer_; }
  O* operator->() noexcept { return optimizer_; }
  auto& param_groups() noexcept { return optimizer_->param_groups(); }
  // The precision keeps per-optimizer state (the grad scaler's) by slot.
  optimizer_slot slot() const noexcept { return slot_; }

 private:
  O* optimizer_;
  Stepper stepper_;
  optimizer_slot slot_;
};

template <class T>
inline constexpr bool is_wrapped_optimizer = false;
template <class O, class Stepper>
inline constexpr bool is_wrapped_optimizer<wrapped_optimizer<O, Stepper>> = true;

}  // namespace loom
