// The gradients' total p-norm when they are split over ranks, and the one
// clipping rule on it: written once for fsdp's shards, deepspeed's partitions
// and tensor parallel's slices (one process clips with
// torch::nn::utils::clip_grad_norm_, whose result and error these match).
#pragma once

#include <loom/comm/process_group.hpp>
#include <loom/util/clip_options.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace loom::detail {

// Each rank adds the gradient pieces it holds; reduce_over() combines the
// ranks of a group that hold disjoint pieces of the whole. The parts are
// kept in double on `device` (the groups' device: what NCCL reduces), each
// piece read where it lives, so nothing waits on the host per piece.
class gradient_norm {
 public:
  gradient_norm(double norm_type, c10::Device device);

  void add(const at::Tensor& piece);          // undefined and empty pieces add nothing
  void add(const gradient_norm& disjoint);    // pieces held here, counted once
  void reduce_over(comm::process_group group);  // sum of |g|^p (max |g| for p = inf); nothing without a group

  double value() const;  // the total norm (one read to the host)
  double norm_type() const noexcept { return norm_type_; }

 private:
  double norm_type_;
  at::Tensor part_;  // {1}, double: sum of |g|^p, or max |g| when p is infinite
};

// Lightning's rule (torch's clip_grad_norm_): a non-finite norm raises
// torch's error (c10::Error, "The total norm of order p ... is non-finite")
// unless options.error_if_nonfinite is false; otherwise the factor
// max_norm / (norm + 1e-6), at most 1 (NaN when the norm is NaN, as torch's).
double clip_coefficient(double norm, const clip_options& options);

// Multiplies each defined gradient by the factor unless it is 1 or more.
void scale_gradients(const std::vector<at::Tensor>& gradients, double coefficient);

// Both: the norm over `norm`'s pieces, checked, and `gradients` scaled by it.
double clip_to_max_norm(const gradient_norm& norm, const std::vector<at::Tensor>& gradients,
                        const clip_options& options);

}  // namespace loom::detail
