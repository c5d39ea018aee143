// comm/autograd.hpp: torch::autograd::Functions over loom's collectives. The
// group travels in the autograd context as a capsule holding its state, so a
// graph keeps the group alive until its backward has run.
#include "process_group_state.hpp"

#include <loom/comm/autograd.hpp>
#include <loom/errors.hpp>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <string>

namespace loom::comm {

namespace {

struct group_capsule : torch::CustomClassHolder {
  explicit group_capsule(std::shared_ptr<process_group_state> state) : state(std::move(state)) {}
  std::shared_ptr<process_group_state> state;
};

c10::IValue capsule_of(const process_group& group) {
  return c10::IValue::make_capsule(c10::make_intrusive<group_capsule>(group.state()));
}

process_group group_of(const c10::IValue& capsule) {
  auto holder = c10::static_intrusive_pointer_cast<group_capsule>(capsule.toCapsule());
  return process_group::attach(holder->state);
}

int64_t normalized(const at::Tensor& input, int64_t dim) {
  const int64_t rank = std::max<int64_t>(input.dim(), 1);
  if (dim < -rank || dim >= rank) {
    throw configuration_error("tensor-parallel collective: dimension " + std::to_string(dim) +
                              " is out of range for a tensor of " + std::to_string(input.dim()) + " dimensions");
  }
  return dim < 0 ? dim + rank : dim;
}

// [size * ...] gathered chunks laid side by side along dim.
at::Tensor gather_along(const process_group& shared, const at::Tensor& input, int64_t dim) {
  process_group group = shared;  // a handle: its collectives are non-const
  if (group.size() == 1) return input;
  const at::Tensor source = input.contiguous();
  std::vector<int64_t> stacked_shape{group.size()};
  for (auto extent : source.sizes()) stacked_shape.push_back(extent);
  at::Tensor stacked = at::empty(stacked_shape, source.options());
  group.all_gather_into(stacked, source).wait();
  return at::cat(stacked.unbind(0), dim);
}

// This rank's chunk along dim of the sum over the ranks.
at::Tensor reduce_scatter_along(const process_group& shared, const at::Tensor& input, int64_t dim) {
  process_group group = shared;  // a handle: its collectives are non-const
  if (group.size() == 1) return input;
  if (input.size(dim) % group.size() != 0) {
    throw configuration_error("reduce_scatter_with_grad: dimension " + std::to_string(dim) + " has size " +
                              std::to_string(input.size(dim)) + ", not a multiple of the group size " +
                              std::to_string(group.size()));
  }
  const at::Tensor chunks = at::stack(input.chunk(group.size(), dim)).contiguous();
  at::Tensor output = at::empty(chunks[0].sizes(), chunks.options());
  group.reduce_scatter_into(output, chunks, reduce_op::sum).wait();
  return output;
}

at::Tensor own_chunk(const process_group& group, const at::Tensor& input, int64_t dim) {
  if (group.size() == 1) return input;
  if (input.size(dim) % group.size() != 0) {
    throw configuration_error("scatter_to_group: dimension " + std::to_string(dim) + " has size " +
                              std::to_string(input.size(dim)) + ", not a multiple of the group size " +
                              std::to_string(group.size()));
  }
  return input.chunk(group.size(), dim)[group.rank()].contiguous();
}

at::Tensor summed(const process_group& shared, const at::Tensor& input) {
  process_group group = shared;  // a handle: its collectives are non-const
  at::Tensor result = input.contiguous().clone();
  group.all_reduce(result, reduce_op::sum);
  return result;
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct copy_function : torch::autograd::Function<copy_function> {
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input, c10::IValue group) {
    context->saved_data["group"] = group;
    return input.view_as(input);
  }
  static variable_list backward(AutogradContext* context, variable_list gradients) {
    return {summed(group_of(context->saved_data["group"]), gradients[0]), at::Tensor()};
  }
};

struct all_reduce_function : torch::autograd::Function<all_reduce_function> {
  static at::Tensor forward(AutogradContext* /*context*/, const at::Tensor& input, c10::IValue group) {
    return summed(group_of(group), input);
  }
  static variable_list backward(AutogradContext* /*context*/, variable_list gradients) {
    return {gradients[0], at::Tensor()};
  }
};

struct all_gather_function : torch::autograd::Function<all_gather_function> {
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input, c10::IValue group, int64_t dim,
                            bool partial) {
    context->saved_data["group"] = group;
    context->saved_data["dim"] = dim;
    context->saved_data["partial"] = partial;
    return gather_along(group_of(group), input, dim);
  }
  static variable_list backward(AutogradContext* context, variable_list gradients) {
    const process_group group = group_of(context->saved_data["group"]);
    const int64_t dim = context->saved_data["dim"].toInt();
    const at::Tensor gradient = context->saved_data["partial"].toBool() ? reduce_scatter_along(group, gradients[0], dim)
                                                                        : own_chunk(group, gradients[0], dim);
    return {gradient, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// A forward along a dimension whose backward all-gathers along it
// (reduce-scatter, and the split that keeps this rank's chunk).
template <at::Tensor (*Forward)(const process_group&, const at::Tensor&, int64_t)>
struct gathered_in_backward : torch::autograd::Function<gathered_in_backward<Forward>> {
  static at::Tensor forward(AutogradContext* context, const at::Tensor& input, c10::IValue group, int64_t dim) {
    context->saved_data["group"] = group;
    context->saved_data["dim"] = dim;
    return Forward(group_of(group), input, dim);
  }
  static variable_list backward(AutogradContext* context, variable_list gradients) {
    return {gather_along(group_of(context->saved_data["group"]), gradients[0], context->saved_data["dim"].toInt()),
            at::Tensor(), at::Tensor()};
  }
};
using reduce_scatter_function = gathered_in_backward<&reduce_scatter_along>;
using scatter_function = gathered_in_backward<&own_chunk>;

}  // namespace

at::Tensor copy_to_group(const process_group& group, const at::Tensor& input) {
  if (group.size() == 1) return input;
  return copy_function::apply(input, capsule_of(group));
}

at::Tensor all_reduce_with_grad(const process_group& group, const at::Tensor& input) {
  if (group.size() == 1) return input;
  return all_reduce_function::apply(input, capsule_of(group));
}

at::Tensor all_gather_with_grad(const process_group& group, const at::Tensor& input, int64_t dim,
                                gathered_gradient gradient) {
  if (group.size() == 1) return input;
  return all_gather_function::apply(input, capsule_of(group), normalized(input, dim),
                                    gradient == gathered_gradient::partial);
}

at::Tensor reduce_scatter_with_grad(const process_group& group, const at::Tensor& input, int64_t dim) {
  if (group.size() == 1) return input;
  return reduce_scatter_function::apply(input, capsule_of(group), normalized(input, dim));
}

at::Tensor scatter_to_group(const process_group& group, const at::Tensor& input, int64_t dim) {
  if (group.size() == 1) return input;
  return scatter_function::apply(input, capsule_of(group), normalized(input, dim));
}

}  // namespace loom::comm
