// The collectives that need more than one call: all_gather that keeps
// autograd, and the boolean decision.
#include <loom/errors.hpp>
#include <loom/strategy/collectives.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <map>
#include <mutex>

namespace loom::collectives {
namespace {

// Autograd keeps only IValues, so the group is found again by its address;
// a weak reference, so a graph that outlives its group does not keep it alive.
std::mutex registry_mutex;
std::map<comm::process_group_state*, std::weak_ptr<comm::process_group_state>> registry;

int64_t remember(const comm::process_group& group) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  registry[group.state().get()] = group.state();
  return reinterpret_cast<int64_t>(group.state().get());
}

comm::process_group recall(int64_t key) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry.find(reinterpret_cast<comm::process_group_state*>(key));
  auto state = it == registry.end() ? nullptr : it->second.lock();
  if (!state) throw std::logic_error("all_gather(sync_grads): the process group is gone before backward ran");
  return comm::process_group::attach(std::move(state));
}

// Lightning's _AllGather: forward gathers; backward sums the gradient of
// every rank's use of the gathered tensor and keeps this rank's slice.
struct all_gather_function : torch::autograd::Function<all_gather_function> {
  static at::Tensor forward(torch::autograd::AutogradContext* context, const at::Tensor& tensor, int64_t group_key) {
    context->saved_data["group"] = group_key;
    auto group = recall(group_key);
    return group.all_gather_stacked(tensor.detach());
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* context,
                                               torch::autograd::tensor_list gradients) {
    auto group = recall(context->saved_data["group"].toInt());
    at::Tensor summed = gradients[0].contiguous().clone();
    group.all_reduce(summed, reduce_op::sum);
    return {summed[group.rank()], at::Tensor()};
  }
};

}  // namespace

at::Tensor all_gather_with_grad(comm::process_group& group, const at::Tensor& tensor) {
  if (!group.valid()) return tensor.unsqueeze(0);
  return all_gather_function::apply(tensor, remember(group));
}

bool reduce_boolean_decision(comm::process_group& group, bool decision, bool all) {
  at::Tensor votes = at::full({1}, decision ? 1 : 0, at::TensorOptions().dtype(at::kInt).device(group.device()));
  group.all_reduce(votes, reduce_op::sum);
  const int yes = votes.item<int>();
  return all ? yes == group.size() : yes > 0;
}

}  // namespace loom::collectives
