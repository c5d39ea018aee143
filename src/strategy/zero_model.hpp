// What loom::deepspeed keeps per set-up model (deepspeed.hpp declares it):
// DeepSpeed's engine state, private to the strategy's sources.
#pragma once

#include <loom/strategy/deepspeed.hpp>
#include <loom/strategy/nvme_stream.hpp>
#include <loom/strategy/zero_loss_scaler.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace loom {

struct deepspeed::zero_model {
  // bf16: a parameter (its data the bf16 partition between steps) and its
  // fp32 master; low and low_grad hold the bf16 tensors during a step.
  struct master_slot {
    at::Tensor param, master, low, low_grad;
  };

  const torch::nn::Module* module = nullptr;
  torch::optim::Optimizer* optimizer = nullptr;
  std::weak_ptr<detail::fsdp_engine> engine;
  std::int64_t micro_steps = 0;
  std::vector<master_slot> masters;
  zero_loss_scaler scaler;
  std::unique_ptr<detail::nvme_stream> nvme;
  std::vector<at::Tensor> nvme_segments;  // the stream's partitions, in order
};

// For a save: the NVMe state file read back into the optimizer as Adam's (or
// AdamW's) per-parameter state, and dropped again when the save is done.
struct deepspeed::nvme_state_in_optimizer {
  explicit nvme_state_in_optimizer(const zero_model& owner);
  nvme_state_in_optimizer(const nvme_state_in_optimizer&) = delete;
  nvme_state_in_optimizer& operator=(const nvme_state_in_optimizer&) = delete;
  ~nvme_state_in_optimizer() { optimizer.state().clear(); }
  torch::optim::Optimizer& optimizer;
};

}  // namespace loom
