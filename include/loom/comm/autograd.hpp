// Collectives that autograd can differentiate through, for tensor parallel
// (Megatron's f and g, and the sequence-parallel pair): each forward
// collective has the transposed collective as its backward.
//
//   copy_to_group          forward: identity              backward: all-reduce (sum)
//   all_reduce_with_grad   forward: all-reduce (sum)      backward: identity
//   all_gather_with_grad   forward: all-gather along dim  backward: reduce-scatter along dim (the gradient
//                                                         is partial on every rank), or this rank's slice
//                                                         (the gradient is the same on every rank)
//   reduce_scatter_with_grad forward: reduce-scatter along dim  backward: all-gather along dim
//   scatter_to_group       forward: this rank's chunk along dim backward: all-gather along dim
//
// In a group of one every one of them is the identity.
#pragma once

#include <loom/comm/process_group.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace loom::comm {

enum class gathered_gradient {
  partial,     // each rank holds a part of the gradient of the gathered tensor: sum them (reduce-scatter)
  replicated,  // every rank holds the whole gradient: keep this rank's slice
};

at::Tensor copy_to_group(const process_group& group, const at::Tensor& input);
at::Tensor all_reduce_with_grad(const process_group& group, const at::Tensor& input);
at::Tensor all_gather_with_grad(const process_group& group, const at::Tensor& input, int64_t dim,
                                gathered_gradient gradient = gathered_gradient::partial);
// input.size(dim) must be a multiple of the group size.
at::Tensor reduce_scatter_with_grad(const process_group& group, const at::Tensor& input, int64_t dim);
at::Tensor scatter_to_group(const process_group& group, const at::Tensor& input, int64_t dim);

}  // namespace loom::comm
