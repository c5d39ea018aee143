// What a trainable module's configure_optimizers returns: the optimizer (a
// shared_ptr or unique_ptr to a torch::optim optimizer) alone, or with a
// learning-rate scheduler and how often it steps (Lightning's
// {"optimizer": ..., "lr_scheduler": {"scheduler": ..., "interval": ...}}).
#pragma once

#include <loom/trainer/lr_scheduler.hpp>

#include <torch/optim/optimizer.h>

#include <concepts>
#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>

namespace loom {

enum class scheduler_interval { step, epoch };

template <class O>
  requires std::derived_from<O, torch::optim::Optimizer>
struct optimization {
  std::shared_ptr<O> optimizer;
  // Built on *optimizer (lr_scheduler(*optimizer, loom::one_cycle_lr{...})).
  std::optional<lr_scheduler> scheduler;
  scheduler_interval interval = scheduler_interval::step;
  std::int64_t frequency = 1;  // step the scheduler every n intervals
};

namespace detail {
template <class T>
struct optimization_of {};
template <class O>
struct optimization_of<optimization<O>> {
  using optimizer_type = O;
  static optimization<O> make(optimization<O> value) { return value; }
};
template <class O>
  requires std::derived_from<O, torch::optim::Optimizer>
struct optimization_of<std::shared_ptr<O>> {
  using optimizer_type = O;
  static optimization<O> make(std::shared_ptr<O> value) { return {.optimizer = std::move(value)}; }
};
template <class O, class D>
  requires std::derived_from<O, torch::optim::Optimizer>
struct optimization_of<std::unique_ptr<O, D>> {
  using optimizer_type = O;
  static optimization<O> make(std::unique_ptr<O, D> value) { return {.optimizer = std::shared_ptr<O>(std::move(value))}; }
};

// Whether configure_optimizers' return type is one loom understands.
template <class T>
concept optimization_result = requires { typename optimization_of<std::remove_cvref_t<T>>::optimizer_type; };
}  // namespace detail

}  // namespace loom
