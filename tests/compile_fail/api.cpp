// Each case_* function must fail to compile with the sentence that api.expect
// gives for it: members a combination cannot honour, and misuse of hooks.
#include <loom/loom.hpp>
#include <loom/trainer/hooks.hpp>
#include <torch/nn/modules/linear.h>
#include <torch/data/samplers/sequential.h>
#include <torch/optim/sgd.h>

namespace {
struct syncing_without_skip : loom::strategy_base {
  static constexpr std::string_view name = "always-sync";
};
struct sharding_strategy : loom::strategy_base {
  static constexpr std::string_view name = "shards-data";
  static constexpr bool needs_distributed_sampler = true;
};
struct joint_setup_strategy : loom::strategy_base {
  static constexpr std::string_view name = "joint";
  static constexpr bool needs_joint_setup = true;
  module_state setup_module_and_optimizers(torch::nn::Module&, std::span<torch::optim::Optimizer* const>, bool) {
    return {};
  }
};
struct wrong_hook_signature {
  void on_train_batch_end(int) {}
};
struct unlisted_trainer_hook {
  void on_fit_start(loom::fit_context&) {}
};
}  // namespace

void case_no_backward_sync_unsupported() {
  loom::Fabric<loom::cpu, syncing_without_skip, loom::fp32> fabric;
  auto model = fabric.setup(torch::nn::Linear(2, 2));
  auto guard = fabric.no_backward_sync(model);
}

void case_callback_signature() { loom::callback entry(wrong_hook_signature{}); }

void case_unlisted_trainer_hook() { loom::callback entry(unlisted_trainer_hook{}); }

void case_call_not_a_hook() {
  loom::Fabric<loom::cpu> fabric;
  fabric.call<int>();
}

void case_clip_raw_objects() {
  loom::Fabric<loom::cpu> fabric;
  torch::nn::Linear linear(2, 2);
  torch::optim::SGD sgd(linear->parameters(), 0.1);
  fabric.clip_gradients(linear, sgd, {.max_norm = 1.0});
}

void case_user_loader_needs_sampler() {
  loom::Fabric<loom::cpu, sharding_strategy, loom::fp32> fabric;
  auto loader = torch::data::make_data_loader(loom::data::tensor_dataset(at::ones({4, 1}), at::ones({4})),
                                              torch::data::samplers::SequentialSampler(4), 2);
  fabric.setup_dataloaders(std::move(loader));
}

void case_joint_setup() {
  loom::Fabric<loom::cpu, joint_setup_strategy, loom::fp32> fabric;
  auto model = fabric.setup_module(torch::nn::Linear(2, 2));
}

void case_joint_setup_optimizers_alone() {
  loom::Fabric<loom::cpu, joint_setup_strategy, loom::fp32> fabric;
  torch::nn::Linear net(2, 2);
  torch::optim::SGD sgd(net->parameters(), 0.1);
  auto optimizer = fabric.setup_optimizers(sgd);
}

void case_joint_setup_without_optimizers() {
  loom::Fabric<loom::cpu, joint_setup_strategy, loom::fp32> fabric;
  auto model = fabric.setup(torch::nn::Linear(2, 2));
}

void case_dropped_no_backward_sync_guard() {
  loom::Fabric<loom::cpu, loom::single_device, loom::fp32> fabric;
  auto model = fabric.setup(torch::nn::Linear(2, 2));
  fabric.no_backward_sync(model);
}
