// What setup_module returns: the user's module, unchanged, whose forward runs
// through the precision (input/output conversion, forward context) and the
// strategy (gradient-sync preparation). For fp32 on one device both are empty
// and forward is exactly module->forward(args...).
#pragma once

#include <loom/util/apply_to_collection.hpp>
#include <loom/util/module_holder.hpp>

#include <c10/core/DeviceType.h>
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <functional>
#include <memory>
#include <type_traits>
#include <utility>

namespace loom {

namespace detail {
// module.forward(args...) as a callable, so forward is one case of run.
struct call_forward {
  template <class Impl, class... Args>
  decltype(auto) operator()(Impl& module, Args&&... args) const {
    return module.forward(std::forward<Args>(args)...);
  }
};
}  // namespace detail

template <ModuleHolder Holder, class Strategy, class Precision, c10::DeviceType Device>
class fabric_module {
 public:
  using holder_type = Holder;
  using impl_type = module_impl_t<Holder>;
  using state_type = typename Strategy::module_state;

  fabric_module(Holder module, Strategy& strategy, Precision& precision, state_type state)
      : module_(std::move(module)), strategy_(&strategy), precision_(&precision), state_(std::move(state)) {}

  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    return run(detail::call_forward{}, std::forward<Args>(args)...);
  }

  // Runs method(module, args...) the way forward runs: inputs converted by
  // the precision, under its context and the strategy's forward (DDP arms
  // its reducer from the outputs), outputs converted. Lightning redirects
  // training_step and validation_step through forward for the same reasons;
  // loom's trainer calls them through here.
  template <class Method, class... Args>
  decltype(auto) run(Method&& method, Args&&... args) {
    impl_type& impl = *module_;
    if constexpr (!Precision::converts_io) {
      return strategy_->forward(state_, impl, [&]() -> decltype(auto) {
        return std::invoke(method, impl, std::forward<Args>(args)...);
      });
    } else {
      const Precision& precision = *precision_;
      auto to_input = [&precision](const at::Tensor& t) { return precision.convert_input(t); };
      auto output = [&] {
        auto context = precision.forward_context(Device);
        return strategy_->forward(state_, impl, [&] {
          return std::invoke(method, impl, apply_to_collection(std::forward<Args>(args), to_input)...);
        });
      }();  // the context ends before outputs are converted, as in Lightning
      return apply_to_collection(std::move(output),
                                 [&precision](const at::Tensor& t) { return precision.convert_output(t); });
    }
  }

  impl_type* operator->() noexcept { return &*module_; }
  const impl_type* operator->() const noexcept { return &*module_; }
  impl_type& operator*() noexcept { return *module_; }
  // The strategy's state for this module (DDP: its reducer).
  state_type& strategy_state() noexcept { return state_; }
  // The holder the user passed in (shares the module, like every holder copy).
  Holder& module() noexcept { return module_; }
  const Holder& module() const noexcept { return module_; }

 private:
  Holder module_;
  Strategy* strategy_;
  Precision* precision_;
  state_type state_;
};

template <class T>
inline constexpr bool is_fabric_module = false;
template <class H, class S, class P, c10::DeviceType D>
inline constexpr bool is_fabric_module<fabric_module<H, S, P, D>> = true;

}  // namespace loom
