// dp's replicas, threads and gather (include/loom/strategy/data_parallel_replicas.hpp).
#include <loom/errors.hpp>
#include <loom/strategy/data_parallel_replicas.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/variable.h>

#include <exception>
#include <thread>

namespace loom::detail {

namespace {

// The gradient of one root parameter from its replicas (one input each):
// summed on the root device and passed to the root's accumulator, where
// autograd adds the root replica's own gradient.
class sum_into_root final : public torch::autograd::Node {
 public:
  explicit sum_into_root(c10::Device root) : root_(root) {}
  torch::autograd::variable_list apply(torch::autograd::variable_list&& gradients) override {
    at::Tensor total;
    for (const auto& gradient : gradients) {
      if (!gradient.defined()) continue;
      at::Tensor here = gradient.to(root_);
      total = total.defined() ? total + here : here;
    }
    return {total};
  }
  std::string name() const override { return "loom::dp::SumIntoRoot"; }

 private:
  c10::Device root_;
};

}  // namespace

replica_set::replica_set(torch::nn::Module& root, std::vector<c10::Device> devices)
    : root_(&root), devices_(std::move(devices)) {
  if (devices_.empty()) throw configuration_error("dp: no device to run on");
}

torch::nn::Module& replica_set::replica(std::size_t index) {
  return index == 0 ? *root_ : *clones_.at(index - 1);
}

void replica_set::refresh(std::size_t count) {
  while (clones_.size() + 1 < count) {
    // Cloneable::clone(device): parameters, buffers and submodules, deep.
    clones_.push_back(root_->clone(devices_[clones_.size() + 1]));
  }
  const auto root_parameters = root_->parameters();
  const auto root_buffers = root_->buffers();
  std::vector<std::shared_ptr<sum_into_root>> nodes(root_parameters.size());
  for (std::size_t k = 0; k < root_parameters.size(); ++k) {
    if (!root_parameters[k].requires_grad()) continue;
    nodes[k] = std::make_shared<sum_into_root>(devices_.front());
    nodes[k]->set_next_edges({torch::autograd::impl::gradient_edge(root_parameters[k])});
  }
  for (std::size_t r = 1; r < count; ++r) {
    torch::nn::Module& replica = *clones_[r - 1];
    replica.train(root_->is_training());
    auto parameters = replica.parameters();
    auto buffers = replica.buffers();
    if (parameters.size() != root_parameters.size() || buffers.size() != root_buffers.size()) {
      throw configuration_error("dp: the module's clone has " + std::to_string(parameters.size()) + " parameters and " +
                                std::to_string(buffers.size()) + " buffers, the module " +
                                std::to_string(root_parameters.size()) + " and " + std::to_string(root_buffers.size()) +
                                "; its reset() must register everything the constructor does");
    }
    {
      at::NoGradGuard no_grad;
      for (std::size_t k = 0; k < parameters.size(); ++k) parameters[k].copy_(root_parameters[k]);
      for (std::size_t k = 0; k < buffers.size(); ++k) buffers[k].copy_(root_buffers[k]);
    }
    // The replica's parameter becomes an output of the parameter's node
    // (input r - 1): its gradient flows to the root's accumulator.
    for (std::size_t k = 0; k < parameters.size(); ++k) {
      if (nodes[k]) torch::autograd::set_history(parameters[k], nodes[k]);
    }
  }
}

void run_replicas(std::size_t count, const std::function<void(std::size_t)>& work) {
  std::vector<std::exception_ptr> errors(count);
  const bool grad_enabled = at::GradMode::is_enabled();
  std::vector<std::thread> threads;
  threads.reserve(count > 0 ? count - 1 : 0);
  for (std::size_t i = 1; i < count; ++i) {
    threads.emplace_back([&, i] {
      try {
        at::AutoGradMode mode(grad_enabled);
        work(i);
      } catch (...) {
        errors[i] = std::current_exception();
      }
    });
  }
  try {
    if (count > 0) work(0);
  } catch (...) {
    errors[0] = std::current_exception();
  }
  for (auto& thread : threads) thread.join();
  for (auto& error : errors) {
    if (error) std::rethrow_exception(error);
  }
}

at::Tensor gather_on_root(const std::vector<at::Tensor>& parts, c10::Device root) {
  std::vector<at::Tensor> here;
  here.reserve(parts.size());
  bool scalars = true;
  for (const auto& part : parts) {
    here.push_back(part.to(root));
    scalars = scalars && part.dim() == 0;
  }
  return scalars ? at::stack(here) : at::cat(here, 0);
}

}  // namespace loom::detail
