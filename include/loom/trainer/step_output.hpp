// What a module's training_step or validation_step returns when it has more
// to say than a loss tensor: the loss and named metrics for the loggers and
// the progress bar (Lightning's {"loss": ..., "acc": ...} return).
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

struct step_output {
  // Backpropagated in training; averaged as "val_loss" in validation. May be
  // left undefined by a validation_step that only reports metrics.
  at::Tensor loss;
  // One-element tensors, logged under these names (averaged over the
  // validation set, weighted by batch size, in validation).
  std::vector<std::pair<std::string, at::Tensor>> metrics;

  // For apply_to_collection / for_each_tensor (precision conversion, DDP's
  // view of the outputs, detaching): the defined tensors inside.
  template <class F>
  step_output map_tensors(F&& function) const {
    step_output out;
    if (loss.defined()) out.loss = to_tensor(function(loss));
    out.metrics.reserve(metrics.size());
    for (const auto& [name, value] : metrics) {
      out.metrics.emplace_back(name, value.defined() ? to_tensor(function(value)) : value);
    }
    return out;
  }
  template <class F>
  void for_each_tensor(F&& function) {
    if (loss.defined()) function(loss);
    for (auto& entry : metrics) {
      if (entry.second.defined()) function(entry.second);
    }
  }

 private:
  template <class T>
  static at::Tensor to_tensor(T&& value) {
    static_assert(std::is_convertible_v<T, at::Tensor>,
                  "loom::step_output holds tensors; a function mapped over it must return a tensor");
    return std::forward<T>(value);
  }
};

}  // namespace loom
