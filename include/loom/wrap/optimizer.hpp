// What setup_optimizers returns: the user's optimizer, whose step runs through
// the strategy and the precision (for 16-mixed: unscale, skip on inf, rescale).
#pragma once

#include <loom/compat.hpp>
#include <loom/concepts.hpp>

#include <torch/optim/optimizer.h>

#include <concepts>

namespace loom {

template <class O, class Strategy, class Precision>
  requires std::derived_from<O, torch::optim::Optimizer>
class fabric_optimizer {
 public:
  using optimizer_type = O;

  fabric_optimizer(O& optimizer, Strategy& strategy, Precision& precision, optimizer_slot slot)
      : optimizer_(&optimizer), strategy_(&strategy), precision_(&precision), slot_(slot) {}

  void step() { strategy_->optimizer_step(*precision_, *optimizer_, slot_); }

  // LibTorch's own zero_grad (1.13: zero in place; 2.x: set to none), unless
  // the strategy needs otherwise (DDP's gradient bucket views).
  void zero_grad() { strategy_->zero_grad(*optimizer_); }
  // The behaviour asked for, on every LibTorch version.
  void zero_grad(bool set_to_none) { compat::zero_grad(*optimizer_, set_to_none); }

  O& optimizer() noexcept { return *optimizer_; }
  const O& optimizer() const noexcept { return *optimizer_; }
  O* operator->() noexcept { return optimizer_; }
  auto& param_groups() noexcept { return optimizer_->param_groups(); }
  optimizer_slot slot() const noexcept { return slot_; }

 private:
  O* optimizer_;
  Strategy* strategy_;
  Precision* precision_;
  optimizer_slot slot_;
};

template <class T>
inline constexpr bool is_fabric_optimizer = false;
template <class O, class S, class P>
inline constexpr bool is_fabric_optimizer<fabric_optimizer<O, S, P>> = true;

}  // namespace loom
