// LibTorch optimizers in the layout of torch.optim.Optimizer.state_dict():
// {'state': {key: {'step': tensor, 'exp_avg': ..., ...}}, 'param_groups':
// [{'lr': ..., 'betas': (..., ...), ..., 'params': [key, ...]}]}, keyed by
// parameter name when every parameter has one (as FSDP's full optimizer
// state dict), else by position (as torch.optim's own). Internal to
// src/checkpoint.
#pragma once

#include <loom/checkpoint/state.hpp>

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace loom::detail {

// Whether this optimizer has the torch.optim layout (SGD, Adam, AdamW,
// RMSprop, Adagrad); the others (LBFGS, user optimizers) keep LibTorch's
// own serialisation.
bool has_torch_optim_layout(torch::optim::Optimizer& optimizer);

c10::IValue optimizer_to_dict(torch::optim::Optimizer& optimizer, const parameter_names& names);
// Empty when value can be loaded into optimizer; else what is wrong with it.
std::string check_optimizer_dict(const c10::IValue& value, torch::optim::Optimizer& optimizer,
                                 const parameter_names& names);
// After check_optimizer_dict passed: options and per-parameter state replaced
// (a parameter without saved state loses its state, as in torch.optim).
void load_optimizer_dict(const c10::IValue& value, torch::optim::Optimizer& optimizer, const parameter_names& names);

}  // namespace loom::detail
