// The units a sharded strategy makes of a module as declared: the root and
// every loom::unit<M> below it, in module order, each with its own
// parameters (a nested unit's are its own; each parameter once, in the first
// unit that registers it). It is what fsdp's engine flattens per unit when no
// wrap policy adds units and no weight is tied across units (the engine then
// moves it to a common ancestor), and what sharded construction cuts a unit
// by (unit_construction.hpp); flat_shard is how either cuts a unit's flat
// buffer into shards. loom-bench's formulas read a model's sizes here.
#pragma once

#include <ATen/core/Tensor.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom {

// [0]: the root's own parameters; then one entry per unit, in module order.
std::vector<std::vector<at::Tensor>> unit_parameters(torch::nn::Module& root);

namespace detail {

// A unit's flat buffer of `numel` elements, padded to a multiple of
// `shards` and cut into equal shards, as seen from shard `rank`: what the
// sharding engine lays out at setup and sharded construction cuts before it
// (the two must agree element for element).
struct flat_shard {
  std::int64_t numel = 0;
  int shards = 1;
  int rank = 0;

  std::int64_t padded() const noexcept { return (numel + shards - 1) / shards * shards; }
  std::int64_t shard_numel() const noexcept { return padded() / shards; }
  std::int64_t begin() const noexcept { return rank * shard_numel(); }
  std::int64_t end() const noexcept { return begin() + shard_numel(); }
  // The elements [offset, offset + count) of the flat buffer that fall in
  // this rank's shard, as [from, to) of the flat buffer (from == to: none).
  std::pair<std::int64_t, std::int64_t> part(std::int64_t offset, std::int64_t count) const noexcept {
    return {std::clamp(offset, begin(), end()), std::clamp(offset + count, begin(), end())};
  }
};

}  // namespace detail

}  // namespace loom
