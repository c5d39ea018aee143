// One gradient norm over pieces on many ranks; see gradient_norm.hpp.
#include <loom/strategy/gradient_norm.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace loom::detail {

namespace {
bool is_max_norm(double norm_type) { return std::isinf(norm_type); }
}  // namespace

gradient_norm::gradient_norm(double norm_type, c10::Device device)
    : norm_type_(norm_type), part_(at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device))) {}

void gradient_norm::add(const at::Tensor& piece) {
  if (!piece.defined() || piece.numel() == 0) return;
  const at::Tensor magnitudes = piece.detach().to(at::kDouble).abs();
  if (is_max_norm(norm_type_)) {
    part_ = at::maximum(part_, magnitudes.max().reshape({1}).to(part_.device()));
  } else {
    part_ += magnitudes.pow(norm_type_).sum().to(part_.device());
  }
}

void gradient_norm::add(const gradient_norm& disjoint) {
  const at::Tensor other = disjoint.part_.to(part_.device());
  part_ = is_max_norm(norm_type_) ? at::maximum(part_, other) : part_ + other;
}

void gradient_norm::reduce_over(comm::process_group group) {
  if (!group.valid()) return;
  if (!is_max_norm(norm_type_)) {
    group.all_reduce(part_, reduce_op::sum);  // a NaN part makes the sum NaN, as on one process
    return;
  }
  // Gloo's max is std::max, which drops a NaN that comes second: a NaN part
  // travels as +inf beside a flag, and is NaN again after the reduction.
  const at::Tensor nan = part_.isnan();
  at::Tensor both = at::cat({part_.masked_fill(nan, std::numeric_limits<double>::infinity()), nan.to(at::kDouble)});
  group.all_reduce(both, reduce_op::max);
  part_ = both.narrow(0, 0, 1).masked_fill(both.narrow(0, 1, 1) > 0, std::numeric_limits<double>::quiet_NaN());
}

double gradient_norm::value() const {
  const double combined = part_.item<double>();
  return is_max_norm(norm_type_) ? combined : std::pow(combined, 1.0 / norm_type_);
}

double clip_coefficient(double norm, const clip_options& options) {
  // Word for word torch::nn::utils::clip_grad_norm_'s check, so every
  // strategy fails as single_device does.
  TORCH_CHECK(!options.error_if_nonfinite || std::isfinite(norm), "The total norm of order ", options.norm_type,
              " for gradients from `parameters` ",
              "is non-finite, so it cannot be clipped. To disable this error and scale ",
              "the gradients with the non-finite norm anyway, set ", "`error_if_nonfinite=false`");
  const double coefficient = *options.max_norm / (norm + 1e-6);
  return std::isnan(coefficient) ? coefficient : std::min(coefficient, 1.0);
}

void scale_gradients(const std::vector<at::Tensor>& gradients, double coefficient) {
  if (coefficient >= 1.0) return;  // NaN scales, as torch's clamp keeps it
  at::NoGradGuard no_grad;
  for (const auto& gradient : gradients) {
    if (gradient.defined()) gradient.mul_(coefficient);
  }
}

double clip_to_max_norm(const gradient_norm& norm, const std::vector<at::Tensor>& gradients,
                        const clip_options& options) {
  const double total = norm.value();
  scale_gradients(gradients, clip_coefficient(total, options));
  return total;
}

}  // namespace loom::detail
