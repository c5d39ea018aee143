// The contract of a module loom::trainer can fit (Lightning's LightningModule,
// the parts its "build your own trainer" uses):
//   Optimization configure_optimizers();                 required
//   Loss training_step(Batch& batch, std::int64_t idx);  required
//   Loss validation_step(Batch& batch, std::int64_t idx); when validation data is given
// where Loss is at::Tensor (the loss) or loom::step_output (loss + metrics)
// and Optimization is what optimization.hpp accepts. A module that misses a
// part fails to compile with a sentence that names it and shows the line to add.
#pragma once

#include <loom/trainer/optimization.hpp>
#include <loom/trainer/step_output.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace loom {

namespace detail {

struct call_training_step {
  template <class Module, class Batch>
  decltype(auto) operator()(Module& module, Batch&& batch, std::int64_t batch_idx) const {
    return module.training_step(std::forward<Batch>(batch), batch_idx);
  }
};
struct call_validation_step {
  template <class Module, class Batch>
  decltype(auto) operator()(Module& module, Batch&& batch, std::int64_t batch_idx) const {
    return module.validation_step(std::forward<Batch>(batch), batch_idx);
  }
};

template <class T>
concept step_result = std::is_same_v<std::remove_cvref_t<T>, at::Tensor> ||
                      std::is_same_v<std::remove_cvref_t<T>, step_output>;

// Whether M has a member named training_step at all (to tell a wrong
// signature from a missing member).
template <class M>
concept names_training_step = requires { &M::training_step; };

template <class Module, class Batch>
constexpr bool validation_step_returns_loss() {
  if constexpr (requires(Module& m, Batch& b, std::int64_t i) { m.validation_step(b, i); }) {
    return step_result<decltype(std::declval<Module&>().validation_step(std::declval<Batch&>(), std::int64_t{}))>;
  } else {
    return false;
  }
}

// Walks the contract in order and stops at the first missing piece.
template <class Module, class Batch, bool NeedsValidation>
constexpr bool diagnose_trainable() {
  if constexpr (!requires(Module& m) { m.configure_optimizers(); }) {
    static_assert(requires(Module& m) { m.configure_optimizers(); },
                  "loom::trainer::fit: the module (see Module in the instantiation context) has no "
                  "configure_optimizers(). Add one that returns its optimizer, e.g. "
                  "std::shared_ptr<torch::optim::Adam> configure_optimizers() { return "
                  "std::make_shared<torch::optim::Adam>(parameters(), torch::optim::AdamOptions(1e-3)); } "
                  "or a loom::optimization<O> with a scheduler.");
    return false;
  } else if constexpr (!optimization_result<decltype(std::declval<Module&>().configure_optimizers())>) {
    static_assert(optimization_result<decltype(std::declval<Module&>().configure_optimizers())>,
                  "loom::trainer::fit: configure_optimizers() returns a type loom cannot use. Return "
                  "std::shared_ptr<O> or std::unique_ptr<O> (O a torch::optim optimizer), or "
                  "loom::optimization<O>{.optimizer = ..., .scheduler = ...}.");
    return false;
  } else if constexpr (!requires(Module& m, Batch& b, std::int64_t i) { m.training_step(b, i); }) {
    if constexpr (names_training_step<Module>) {
      static_assert(requires(Module& m, Batch& b, std::int64_t i) { m.training_step(b, i); },
                    "loom::trainer::fit: the module's training_step cannot be called as training_step(batch, "
                    "batch_idx) with this loader's batches (see Batch in the instantiation context). Give it the "
                    "parameters (const Batch& batch, std::int64_t batch_idx).");
    } else {
      static_assert(requires(Module& m, Batch& b, std::int64_t i) { m.training_step(b, i); },
                    "loom::trainer::fit: the module (see Module in the instantiation context) has no "
                    "training_step. Add: at::Tensor training_step(const Batch& batch, std::int64_t batch_idx) "
                    "returning the loss (or a loom::step_output with the loss and metrics).");
    }
    return false;
  } else if constexpr (!step_result<decltype(std::declval<Module&>().training_step(std::declval<Batch&>(),
                                                                                   std::int64_t{}))>) {
    static_assert(step_result<decltype(std::declval<Module&>().training_step(std::declval<Batch&>(),
                                                                             std::int64_t{}))>,
                  "loom::trainer::fit: training_step must return at::Tensor (the loss) or loom::step_output "
                  "(the loss and metrics to log).");
    return false;
  } else if constexpr (NeedsValidation && !requires(Module& m, Batch& b, std::int64_t i) { m.validation_step(b, i); }) {
    static_assert(!NeedsValidation || requires(Module& m, Batch& b, std::int64_t i) { m.validation_step(b, i); },
                  "loom::trainer::fit: validation data was given, but the module has no validation_step(batch, "
                  "batch_idx) for its batches. Add: loom::step_output validation_step(const Batch& batch, "
                  "std::int64_t batch_idx) (or at::Tensor, logged as val_loss), or call fit without validation "
                  "data.");
    return false;
  } else if constexpr (NeedsValidation && !validation_step_returns_loss<Module, Batch>()) {
    static_assert(!NeedsValidation,
                  "loom::trainer::fit: validation_step must return at::Tensor (logged as val_loss) or "
                  "loom::step_output.");
    return false;
  } else {
    return true;
  }
}

}  // namespace detail

// For user code that wants to check its module early: the same contract as a concept.
template <class Module, class Batch>
concept TrainableModule = requires(Module& m, Batch& b, std::int64_t i) {
  { m.configure_optimizers() } -> detail::optimization_result;
  { m.training_step(b, i) } -> detail::step_result;
};

}  // namespace loom
