// Lightning's hook names for the events of a training loop: loom's trainer
// calls them, and so may any loop written with a Fabric
// (fabric.call<loom::on_train_epoch_end>(epoch)), so a callback serves both.
// Their arguments are plain values; the hooks whose arguments are the
// trainer's own types are the trainer's (trainer/hooks.hpp).
#pragma once

#include <loom/callbacks/hook.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <tuple>

namespace torch::optim {
class Optimizer;
}

namespace loom {

class state;

LOOM_DECLARE_HOOK(on_train_start);
LOOM_DECLARE_HOOK(on_train_end);
LOOM_DECLARE_HOOK(on_train_epoch_start, std::int64_t /*epoch*/);
LOOM_DECLARE_HOOK(on_train_epoch_end, std::int64_t /*epoch*/);
LOOM_DECLARE_HOOK(on_train_batch_start, std::int64_t /*batch_idx*/);
LOOM_DECLARE_HOOK(on_train_batch_end, const at::Tensor& /*loss*/, std::int64_t /*batch_idx*/);
LOOM_DECLARE_HOOK(on_before_backward, const at::Tensor& /*loss*/);
LOOM_DECLARE_HOOK(on_before_optimizer_step, torch::optim::Optimizer& /*optimizer*/);
LOOM_DECLARE_HOOK(on_before_zero_grad, torch::optim::Optimizer& /*optimizer*/);
LOOM_DECLARE_HOOK(on_validation_start);
LOOM_DECLARE_HOOK(on_validation_end);
LOOM_DECLARE_HOOK(on_validation_batch_end, const at::Tensor& /*output*/, std::int64_t /*batch_idx*/);
// Before a checkpoint is written or read: a callback adds the entries of its
// own state (by reference), which are then saved, or restored in place.
LOOM_DECLARE_HOOK(on_save_checkpoint, state& /*checkpoint*/);
LOOM_DECLARE_HOOK(on_load_checkpoint, state& /*checkpoint*/);

// The hooks every callback is checked against at registration. A callback
// that implements hooks of its own lists them: `using loom_hooks = std::tuple<my_hook>;`.
using builtin_hooks =
    std::tuple<on_train_start, on_train_end, on_train_epoch_start, on_train_epoch_end, on_train_batch_start,
               on_train_batch_end, on_before_backward, on_before_optimizer_step, on_before_zero_grad,
               on_validation_start, on_validation_end, on_validation_batch_end, on_save_checkpoint,
               on_load_checkpoint>;

}  // namespace loom
