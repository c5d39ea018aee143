// Tensor-parallel styles, with PyTorch's names and semantics
// (torch.distributed.tensor.parallel): what a plan assigns to a layer, and
// where its input and output lie across the tensor-parallel group.
//
//   colwise_parallel  Linear: weight and bias sharded on the output dimension;
//                     input replicated (or sharded along a sequence dimension:
//                     all-gathered first); output sharded on the last
//                     dimension (or gathered: output_layout = replicate()).
//                     Embedding: weight sharded on the embedding dimension.
//   rowwise_parallel  Linear: weight sharded on the input dimension, bias
//                     replicated; input sharded on the last dimension (or
//                     replicated: this rank's chunk is taken); the partial
//                     outputs are all-reduced (output_layout = replicate()) or
//                     reduce-scattered along the sequence (shard(1)).
//                     Embedding: vocabulary-parallel (weight sharded on the
//                     vocabulary; ids outside this rank's range give zeros).
//   prepare_module_input  the layout conversion at a block's entry, for a
//                     loom::tp::Prepare the block calls on its input.
//   sequence_parallel LayerNorm/Dropout on a sequence-sharded input.
//
// Every forward collective has its transpose in backward (comm/autograd.hpp).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace loom::tp {

// Where a tensor's data lies across the group (DTensor's Replicate / Shard(dim)).
struct layout {
  enum class placement : std::uint8_t { replicate, shard };
  placement kind = placement::replicate;
  std::int64_t dim = 0;
  friend bool operator==(const layout&, const layout&) = default;
};
inline constexpr layout replicate() noexcept { return {}; }
inline constexpr layout shard(std::int64_t dim) noexcept { return {layout::placement::shard, dim}; }

struct colwise_parallel {
  layout input_layout = replicate();
  layout output_layout = shard(-1);
  // The input comes from a loom::tp::Prepare (PyTorch: a DTensor from
  // PrepareModuleInput): it is already replicated on the group and its
  // gradient is all-reduced there, once for every layer that reads it (wq,
  // wk and wv share one). Without it, each column-wise layer all-reduces the
  // gradient of its own input.
  bool input_prepared = false;
};

struct rowwise_parallel {
  layout input_layout = shard(-1);
  layout output_layout = replicate();
};

// For a loom::tp::Prepare: converts its input from input_layout to
// desired_input_layout (PyTorch's PrepareModuleInput): replicate to
// replicate enters the tensor-parallel region (identity forward, all-reduce
// of the gradient), shard(d) to replicate all-gathers (reduce-scatter of the
// gradient), replicate to shard(d) keeps this rank's chunk.
struct prepare_module_input {
  layout input_layout = replicate();
  layout desired_input_layout = replicate();
};

// For a loom::tp::LayerNorm or loom::tp::Dropout in a sequence-parallel
// region (PyTorch's SequenceParallel): the input is sharded along
// sequence_dim, the parameters stay replicated and compute on the local
// part; their gradients, partial on each rank, are all-reduced over the
// group (Megatron's rule). Dropout draws a mask per rank (the activations
// differ), from a generator seeded from the global seed and the rank.
struct sequence_parallel {
  std::int64_t sequence_dim = 1;
};

using parallel_style = std::variant<colwise_parallel, rowwise_parallel, prepare_module_input, sequence_parallel>;

// Submodule names (as named_modules() gives them; '*' matches one path
// segment, as in "blocks.*.mlp.up") and the style each gets.
using parallelize_plan = std::vector<std::pair<std::string, parallel_style>>;

std::string describe(const parallel_style& style);

}  // namespace loom::tp
