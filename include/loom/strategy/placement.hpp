// Where one parameter's full tensor lies across ranks: the placement record
// every sharded strategy publishes (PyTorch FSDP2's FSDPParam, a DTensor's
// placements), and what is written once over it. The fsdp engine (and ZeRO,
// which runs on it) slices each parameter flat; tensor parallel's layers
// chunk it along a dimension; model_parallel does both on a 2-D mesh (the
// engine slices the chunk). From the record alone: the full tensor from this
// rank's part (gather_full, a collective), this rank's part of a full tensor
// (local_part), and what a sharded checkpoint says of it (save_range). The
// full-state scope (full_state.hpp) and the gradient norm over placements
// (clip_placed) are built on these.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/comm/process_group.hpp>
#include <loom/util/clip_options.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace loom::detail {

struct placement {
  at::Tensor parameter;  // the user's parameter
  // This rank's part as it lives between steps: the engine's shard view of
  // it (what the optimizer steps), or the parameter's own data.
  at::Tensor local;
  bool engine_owned = false;  // local is the engine's view: written into, never replaced
  std::vector<std::int64_t> shape;  // the full parameter's

  // Chunked along tensor dimension `dim` into chunk_group.size() equal
  // chunks, this rank holding chunk chunk_group.rank() (tensor parallel).
  // dim < 0: not chunked.
  std::int64_t dim = -1;
  comm::process_group chunk_group;

  // Sliced flat (fsdp, ZeRO): the chunk's elements lie at [offset, offset +
  // chunk numel) of a flat buffer cut into slice_group.size() parts of
  // `stride` elements; this rank holds the intersection with its part.
  // An invalid slice_group: not sliced.
  std::int64_t offset = 0;
  std::int64_t stride = 0;
  comm::process_group slice_group;

  // The ranks holding the same part (HYBRID_SHARD's and NO_SHARD's replicas,
  // a tensor-parallel group for a parameter it does not chunk): what a norm
  // counts once.
  std::vector<comm::process_group> replicated_over;

  std::int64_t parts() const noexcept { return dim < 0 ? 1 : chunk_group.size(); }
  std::vector<std::int64_t> chunk_shape() const;
  std::int64_t chunk_numel() const;
  bool sliced() const noexcept { return slice_group.valid() && slice_group.size() > 1; }
  bool split() const noexcept { return sliced() || parts() > 1; }
  // The flat elements of the chunk that rank `rank` of slice_group holds.
  std::pair<std::int64_t, std::int64_t> slice_range(int rank) const;
};

// The full tensor (shape `shape`) from this rank's part of it: local, or an
// optimizer state field of the same elements. Collective over the slice
// group, then the chunk group; every rank of them calls it in the same order.
// The result lives on the groups' device.
at::Tensor gather_full(const placement& where, const at::Tensor& part);
// This rank's part of a full tensor (no collective), shaped as `local`.
at::Tensor local_part(const placement& where, const at::Tensor& full);
// What a sharded checkpoint records of this rank's part; nullopt when the
// parameter is not split (it is written whole).
std::optional<shard_range> save_range(const placement& where);

// The gradients' total norm over the placed parameters (each piece counted
// once: summed over the groups that split it, not over its replicas) and the
// clipping by it (gradient_norm.hpp's rule); clip_val clamps elementwise.
std::optional<double> clip_placed(const std::vector<placement>& placed, const clip_options& options);

}  // namespace loom::detail
