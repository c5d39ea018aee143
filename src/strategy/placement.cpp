// The placement record's arithmetic and collectives (placement.hpp).
#include <loom/strategy/gradient_norm.hpp>
#include <loom/strategy/placement.hpp>
#include <loom/util/clip_gradients.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace loom::detail {

std::vector<std::int64_t> placement::chunk_shape() const {
  std::vector<std::int64_t> out = shape;
  if (dim >= 0) out[static_cast<std::size_t>(dim)] /= parts();
  return out;
}

std::int64_t placement::chunk_numel() const {
  std::int64_t numel = 1;
  for (std::int64_t extent : chunk_shape()) numel *= extent;
  return numel;
}

std::pair<std::int64_t, std::int64_t> placement::slice_range(int rank) const {
  if (!sliced()) return {0, chunk_numel()};
  const std::int64_t numel = chunk_numel();
  return {std::clamp<std::int64_t>(rank * stride - offset, 0, numel),
          std::clamp<std::int64_t>((rank + 1) * stride - offset, 0, numel)};
}

namespace {

// The chunk (flat) from every slice rank's piece: the pieces padded to the
// longest, gathered in one collective, and laid end to end.
at::Tensor gather_slices(const placement& where, const at::Tensor& piece) {
  comm::process_group group = where.slice_group;
  std::int64_t longest = 0;
  for (int r = 0; r < group.size(); ++r) {
    const auto [begin, end] = where.slice_range(r);
    longest = std::max(longest, end - begin);
  }
  const at::Tensor flat = piece.reshape({-1}).to(group.device());
  at::Tensor padded = at::zeros({longest}, flat.options());
  padded.narrow(0, 0, flat.numel()).copy_(flat);
  at::Tensor everyone = at::empty({group.size(), longest}, flat.options());
  group.all_gather_into(everyone, padded).wait();
  std::vector<at::Tensor> pieces;
  for (int r = 0; r < group.size(); ++r) {
    const auto [begin, end] = where.slice_range(r);
    pieces.push_back(everyone[r].narrow(0, 0, end - begin));
  }
  return at::cat(pieces);
}

at::Tensor gather_chunks(const placement& where, const at::Tensor& chunk) {
  comm::process_group group = where.chunk_group;
  return at::cat(group.all_gather_stacked(chunk.contiguous().to(group.device())).unbind(0), where.dim);
}

}  // namespace

at::Tensor gather_full(const placement& where, const at::Tensor& part) {
  at::NoGradGuard no_grad;
  at::Tensor chunk = where.sliced() ? gather_slices(where, part) : part;
  chunk = chunk.reshape(where.chunk_shape());
  return where.parts() > 1 ? gather_chunks(where, chunk) : chunk;
}

at::Tensor local_part(const placement& where, const at::Tensor& full) {
  at::NoGradGuard no_grad;
  at::Tensor chunk = full.reshape(where.shape);
  if (where.parts() > 1) chunk = chunk.chunk(where.parts(), where.dim)[where.chunk_group.rank()];
  if (where.sliced()) {
    const auto [begin, end] = where.slice_range(where.slice_group.rank());
    chunk = chunk.reshape({-1}).narrow(0, begin, end - begin);
  }
  return chunk.reshape(where.local.sizes());
}

std::optional<shard_range> save_range(const placement& where) {
  if (!where.split()) return std::nullopt;
  const auto [begin, end] = where.slice_range(where.sliced() ? where.slice_group.rank() : 0);
  shard_range range{begin, end, where.shape};
  if (where.parts() > 1) {
    range.dim = where.dim;
    range.part = where.chunk_group.rank();
    range.parts = where.parts();
  }
  return range;
}

std::optional<double> clip_placed(const std::vector<placement>& placed, const clip_options& options) {
  std::vector<at::Tensor> gradients;
  for (const auto& where : placed) {
    if (where.parameter.grad().defined()) gradients.push_back(where.parameter.grad());
  }
  if (options.clip_val) return clip_gradient_values(gradients, options);  // elementwise: a part as the whole
  // The pieces split over the same groups form one bucket, reduced over those
  // groups; buckets in the records' order (every rank's), each reduced even
  // where this rank holds no gradient, so the collectives match.
  // A group of one still reduces (nothing), so every split runs the same code.
  auto slice_over = [](const placement& where) { return where.slice_group.valid() ? where.slice_group.state().get() : nullptr; };
  auto chunk_over = [](const placement& where) {
    return where.dim >= 0 && where.chunk_group.valid() ? where.chunk_group.state().get() : nullptr;
  };
  c10::Device device = gradients.empty() ? c10::Device(at::kCPU) : gradients.front().device();
  for (const auto& where : placed) {
    if (slice_over(where)) device = where.slice_group.device();
    else if (chunk_over(where)) device = where.chunk_group.device();
  }
  struct bucket {
    const void* slice_over;
    const void* chunk_over;
    comm::process_group slice_group, chunk_group;
    gradient_norm norm;
  };
  std::vector<bucket> buckets;
  for (const auto& where : placed) {
    const void* slices = slice_over(where);
    const void* chunks = chunk_over(where);
    auto found = std::find_if(buckets.begin(), buckets.end(),
                              [&](const bucket& b) { return b.slice_over == slices && b.chunk_over == chunks; });
    if (found == buckets.end()) {
      buckets.push_back({slices, chunks, slices ? where.slice_group : comm::process_group(),
                         chunks ? where.chunk_group : comm::process_group(), gradient_norm(options.norm_type, device)});
      found = std::prev(buckets.end());
    }
    found->norm.add(where.parameter.grad());
  }
  gradient_norm total(options.norm_type, device);
  for (auto& b : buckets) {
    b.norm.reduce_over(b.slice_group);
    b.norm.reduce_over(b.chunk_group);
    total.add(b.norm);
  }
  return clip_to_max_norm(total, gradients, options);
}

}  // namespace loom::detail
