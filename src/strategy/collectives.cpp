// The boolean decision, and Lightning's all_gather that keeps autograd: one
// scheme of differentiable collectives (comm/autograd.hpp) serves it and
// tensor parallel alike.
#include <loom/comm/autograd.hpp>
#include <loom/strategy/collectives.hpp>

#include <ATen/ATen.h>

namespace loom::collectives {

// Lightning's _AllGather: forward stacks every rank's tensor; backward sums
// the gradient of every rank's use of the gathered tensor and keeps this
// rank's slice, which is the reduce-scatter of the stacked gradient.
at::Tensor all_gather_with_grad(comm::process_group& group, const at::Tensor& tensor) {
  if (!group.valid()) return tensor.unsqueeze(0);
  return comm::all_gather_with_grad(group, tensor.unsqueeze(0), 0, comm::gathered_gradient::partial);
}

bool reduce_boolean_decision(comm::process_group& group, bool decision, bool all) {
  at::Tensor votes = at::full({1}, decision ? 1 : 0, at::TensorOptions().dtype(at::kInt).device(group.device()));
  group.all_reduce(votes, reduce_op::sum);
  const int yes = votes.item<int>();
  return all ? yes == group.size() : yes > 0;
}

}  // namespace loom::collectives
