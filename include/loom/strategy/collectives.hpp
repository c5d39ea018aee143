// Collectives over a process group for a tensor or a nested container of
// tensors (Lightning's apply_to_collection): each tensor in the value is
// reduced, gathered or broadcast, and the result keeps the value's shape.
#pragma once

#include <loom/comm/process_group.hpp>
#include <loom/util/apply_to_collection.hpp>

#include <utility>
#include <vector>

namespace loom::collectives {

using comm::check_mean_dtype;

// Returns the reduced values; the inputs are left as they were.
template <class T>
auto all_reduce(comm::process_group& group, T&& value, reduce_op op) {
  return apply_to_collection(std::forward<T>(value), [&](const at::Tensor& tensor) {
    at::Tensor result = tensor.clone();
    group.all_reduce(result, op);
    return result;
  });
}

// Each tensor becomes one tensor per rank (shapes may differ across ranks).
template <class T>
auto all_gather_per_rank(comm::process_group& group, T&& value) {
  return apply_to_collection(std::forward<T>(value),
                             [&](const at::Tensor& tensor) { return group.all_gather_per_rank(tensor); });
}

// The gathered tensors of all ranks stacked into [world_size, ...] (equal
// shapes). With sync_grads, gradients flow back to every rank's input.
at::Tensor all_gather_with_grad(comm::process_group& group, const at::Tensor& tensor);

// Lightning's all_gather: [world_size, ...] (equal shapes), and the tensor
// itself, with no added dimension, in a group of one.
template <class T>
auto all_gather(comm::process_group& group, T&& value, bool sync_grads) {
  return apply_to_collection(std::forward<T>(value), [&](const at::Tensor& tensor) {
    if (group.size() == 1) return tensor;
    return sync_grads ? all_gather_with_grad(group, tensor) : group.all_gather_stacked(tensor);
  });
}

template <class T>
auto broadcast(comm::process_group& group, T&& value, int source) {
  return apply_to_collection(std::forward<T>(value), [&](const at::Tensor& tensor) {
    at::Tensor result = tensor.clone();
    group.broadcast(result, source);
    return result;
  });
}

template <class T>
auto reduce_scatter(comm::process_group& group, T&& value, reduce_op op) {
  return apply_to_collection(std::forward<T>(value),
                             [&](const at::Tensor& tensor) { return group.reduce_scatter(tensor, op); });
}

// all: every rank decided true; otherwise: any rank did.
bool reduce_boolean_decision(comm::process_group& group, bool decision, bool all);

}  // namespace loom::collectives
