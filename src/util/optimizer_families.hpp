// LibTorch's optimizer families (Adam, AdamW, SGD, RMSprop, Adagrad) with
// torch.optim's names for their options and per-parameter state: one table
// per family, read by the checkpoint layer (the torch.optim state_dict
// layout, src/checkpoint/optimizer_state.cpp) and by every strategy that
// gathers or slices optimizer state (fsdp, tensor parallel). Internal to
// src/ (util: any layer may include it).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/optimizer.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

namespace loom::detail {

using betas_t = std::tuple<double, double>;

// One family: torch.optim's names for LibTorch's options and per-parameter state.
template <class Optimizer, class Options, class State>
struct family {
  using optimizer_type = Optimizer;
  using options_type = Options;
  using state_type = State;
  std::string_view type;
  std::vector<std::pair<std::string, double& (*)(Options&)>> numbers;
  std::vector<std::pair<std::string, bool& (*)(Options&)>> flags;
  betas_t& (*betas)(Options&) = nullptr;
  std::vector<std::pair<std::string, at::Tensor& (*)(State&)>> tensors;
  std::int64_t& (*step)(State&) = nullptr;  // saved as a float tensor, as torch.optim keeps it
};

#define LOOM_FIELD(Type, member) \
  { #member, +[](Type& object) -> auto& { return object.member(); } }

template <class Optimizer, class O, class S>
family<Optimizer, O, S> adam_like(std::string_view type) {
  return {type,
          {LOOM_FIELD(O, lr), LOOM_FIELD(O, eps), LOOM_FIELD(O, weight_decay)},
          {LOOM_FIELD(O, amsgrad)},
          +[](O& options) -> betas_t& { return options.betas(); },
          {LOOM_FIELD(S, exp_avg), LOOM_FIELD(S, exp_avg_sq), LOOM_FIELD(S, max_exp_avg_sq)},
          +[](S& state) -> std::int64_t& { return state.step(); }};
}

inline const auto& adam_family() {
  static const auto made = adam_like<torch::optim::Adam, torch::optim::AdamOptions, torch::optim::AdamParamState>(
      "torch::optim::Adam");
  return made;
}
inline const auto& adamw_family() {
  static const auto made = adam_like<torch::optim::AdamW, torch::optim::AdamWOptions, torch::optim::AdamWParamState>(
      "torch::optim::AdamW");
  return made;
}
inline const auto& sgd_family() {
  using O = torch::optim::SGDOptions;
  using S = torch::optim::SGDParamState;
  static const family<torch::optim::SGD, O, S> made{
      "torch::optim::SGD",
      {LOOM_FIELD(O, lr), LOOM_FIELD(O, momentum), LOOM_FIELD(O, dampening), LOOM_FIELD(O, weight_decay)},
      {LOOM_FIELD(O, nesterov)},
      nullptr,
      {LOOM_FIELD(S, momentum_buffer)},
      nullptr};
  return made;
}
inline const auto& rmsprop_family() {
  using O = torch::optim::RMSpropOptions;
  using S = torch::optim::RMSpropParamState;
  static const family<torch::optim::RMSprop, O, S> made{
      "torch::optim::RMSprop",
      {LOOM_FIELD(O, lr), LOOM_FIELD(O, alpha), LOOM_FIELD(O, eps), LOOM_FIELD(O, weight_decay),
       LOOM_FIELD(O, momentum)},
      {LOOM_FIELD(O, centered)},
      nullptr,
      {LOOM_FIELD(S, square_avg), LOOM_FIELD(S, momentum_buffer), LOOM_FIELD(S, grad_avg)},
      +[](S& s) -> std::int64_t& { return s.step(); }};
  return made;
}
inline const auto& adagrad_family() {
  using O = torch::optim::AdagradOptions;
  using S = torch::optim::AdagradParamState;
  static const family<torch::optim::Adagrad, O, S> made{
      "torch::optim::Adagrad",
      {LOOM_FIELD(O, lr), LOOM_FIELD(O, lr_decay), LOOM_FIELD(O, weight_decay), LOOM_FIELD(O, initial_accumulator_value),
       LOOM_FIELD(O, eps)},
      {},
      nullptr,
      {LOOM_FIELD(S, sum)},
      +[](S& s) -> std::int64_t& { return s.step(); }};
  return made;
}
#undef LOOM_FIELD

// Calls visit(family) for the optimizer's family; false when it has none.
template <class Visit>
bool with_family(torch::optim::Optimizer& optimizer, Visit&& visit) {
  auto is = [&optimizer](const auto& family) {
    using optimizer_type = typename std::remove_cvref_t<decltype(family)>::optimizer_type;
    return typeid(optimizer) == typeid(optimizer_type);
  };
  if (is(adam_family())) return visit(adam_family()), true;
  if (is(adamw_family())) return visit(adamw_family()), true;
  if (is(sgd_family())) return visit(sgd_family()), true;
  if (is(rmsprop_family())) return visit(rmsprop_family()), true;
  if (is(adagrad_family())) return visit(adagrad_family()), true;
  return false;
}

// Calls visit(parameter, field, tensor) for every per-parameter state tensor
// (exp_avg, momentum_buffer, ...), which visit may replace (sharded
// strategies gather and slice them), once per state even when the
// optimizer lists a (tied) parameter twice. False when the optimizer's family is
// not known (its state is then not visited).
bool for_each_state_tensor(torch::optim::Optimizer& optimizer,
                           const std::function<void(const at::Tensor& parameter, std::string_view field,
                                                    at::Tensor& value)>& visit);

}  // namespace loom::detail
