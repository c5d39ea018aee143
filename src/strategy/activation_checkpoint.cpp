// Activation checkpointing (unit.hpp's checkpointed_forward): LibTorch 1.13
// has no checkpoint API, so this is an autograd node of loom's own. Forward
// runs the module without building a graph (no activations kept) and hands
// back an output whose gradient function is this node; backward restores
// the CPU RNG state the forward started from (dropout draws the same masks),
// recomputes the forward with autograd on, and runs a re-entrant backward
// through it: the inputs' gradients are returned, the parameters'
// accumulate as in plain autograd (and the sharding engine's hooks fire).
#include <loom/strategy/unit.hpp>

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>

#include <mutex>
#include <utility>

namespace loom::detail {

namespace {

at::Tensor cpu_rng_state() {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}
void set_cpu_rng_state(const at::Tensor& state) {
  auto generator = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

class checkpoint_node final : public torch::autograd::Node {
 public:
  checkpoint_node(std::vector<at::Tensor> inputs, std::function<at::Tensor(const std::vector<at::Tensor>&)> run,
                  at::Tensor rng_state)
      : inputs_(std::move(inputs)), run_(std::move(run)), rng_state_(std::move(rng_state)) {}

  std::string name() const override { return "loom::CheckpointBackward"; }

  torch::autograd::variable_list apply(torch::autograd::variable_list&& grads) override {
    const at::Tensor after = cpu_rng_state();
    set_cpu_rng_state(rng_state_);
    std::vector<at::Tensor> detached;
    detached.reserve(inputs_.size());
    for (const auto& input : inputs_) {
      at::Tensor copy = input.detach();
      if (input.requires_grad()) copy.requires_grad_(true);
      detached.push_back(std::move(copy));
    }
    at::Tensor output;
    {
      at::AutoGradMode enable(true);
      output = run_(detached);
    }
    set_cpu_rng_state(after);
    if (output.requires_grad()) torch::autograd::backward({output}, {grads.at(0)});
    torch::autograd::variable_list out;
    out.reserve(detached.size());
    for (auto& input : detached) out.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    inputs_.clear();  // each backward runs once
    return out;
  }

 private:
  std::vector<at::Tensor> inputs_;
  std::function<at::Tensor(const std::vector<at::Tensor>&)> run_;
  at::Tensor rng_state_;
};

}  // namespace

at::Tensor checkpointed_forward(const std::vector<at::Tensor>& inputs,
                                std::function<at::Tensor(const std::vector<at::Tensor>&)> run) {
  at::Tensor rng_state = cpu_rng_state();
  at::Tensor output;
  {
    at::NoGradGuard no_grad;
    output = run(inputs);
  }
  auto node = std::make_shared<checkpoint_node>(inputs, std::move(run), std::move(rng_state));
  node->set_next_edges(torch::autograd::collect_next_edges(inputs));
  torch::autograd::create_gradient_edge(output, node);
  return output;
}

}  // namespace loom::detail
