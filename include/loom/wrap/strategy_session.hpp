// The static Fabric's session and stepper: a module's and an optimizer's
// bindings to the strategy and precision, resolved by the compiler (plain
// pointers into the Fabric, which does not move).
#pragma once

#include <loom/concepts/base.hpp>
#include <loom/util/decided.hpp>
#include <loom/util/module_fwd.hpp>
#include <loom/wrap/module.hpp>
#include <loom/wrap/optimizer.hpp>

#include <c10/core/DeviceType.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <utility>

namespace loom {

struct clip_options;

template <class Strategy, class Precision, c10::DeviceType Device>
class strategy_session {
 public:
  using state_type = typename Strategy::module_state;
  static constexpr decided io_conversion = decided_from(Precision::converts_io);

  strategy_session(Strategy& strategy, Precision& precision, state_type state)
      : strategy_(&strategy), precision_(&precision), state_(std::move(state)) {}

  static constexpr bool converts_io() noexcept { return Precision::converts_io; }
  auto forward_context() const { return precision_->forward_context(Device); }
  template <class Body>
  decltype(auto) forward(torch::nn::Module& module, Body&& body) {
    return strategy_->forward(state_, module, std::forward<Body>(body));
  }
  // The strategy runs forward itself, from the arguments (dp: one replica
  // per device, each calling body(replica, its chunk of the arguments...)).
  static constexpr bool replicates_forward = loom::replicates_forward<Strategy>;
  template <class Impl, class Body, class... Args>
  auto forward_replicas(Impl& module, Body&& body, const Args&... arguments) {
    return strategy_->forward_replicas(state_, module, std::forward<Body>(body), arguments...);
  }
  at::Tensor convert_input(const at::Tensor& tensor) const { return precision_->convert_input(tensor); }
  at::Tensor convert_output(const at::Tensor& tensor) const { return precision_->convert_output(tensor); }
  std::optional<double> clip_gradients(torch::nn::Module& module, const clip_options& options) {
    return strategy_->clip_gradients(state_, module, options);
  }
  auto no_backward_sync(bool enabled) { return strategy_->no_backward_sync(state_, enabled); }

  // The strategy's state for this module (DDP: its reducer).
  state_type& state() noexcept { return state_; }

 private:
  Strategy* strategy_;
  Precision* precision_;
  state_type state_;
};

template <class Strategy, class Precision>
class strategy_stepper {
 public:
  strategy_stepper(Strategy& strategy, Precision& precision) noexcept : strategy_(&strategy), precision_(&precision) {}
  void step(torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    strategy_->optimizer_step(*precision_, optimizer, slot);
  }
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) { strategy_->zero_grad(optimizer, set_to_none); }

 private:
  Strategy* strategy_;
  Precision* precision_;
};

// The names the static Fabric's setup returns.
template <class Holder, class Strategy, class Precision, c10::DeviceType Device>
using fabric_module = wrapped_module<Holder, strategy_session<Strategy, Precision, Device>>;
template <class O, class Strategy, class Precision>
using fabric_optimizer = wrapped_optimizer<O, strategy_stepper<Strategy, Precision>>;

}  // namespace loom
