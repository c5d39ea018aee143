// Sharded construction: inside fabric.init_module(true) (Lightning's
// empty_init=True) under a strategy that shards at construction (fsdp
// FULL_SHARD, deepspeed stage 3), each loom::unit<M> keeps only this rank's
// shard of its own parameters the moment its constructor returns, so a
// model larger than one process can be built unit by unit. Every rank builds
// each unit whole, in constructor order, with the same seed (CPU generators
// cannot skip ahead), takes rank 0's values (sync_module_states) and keeps
// its slice of the unit's flat buffer, laid out as the sharding engine lays
// units out: the unit's own parameters (those of nested units are theirs)
// in module order, padded to a multiple of the shard group's size. Until
// setup, each such parameter is a placeholder of its shape over one NaN (4
// bytes): a forward before setup computes NaN. Setup adopts the shards and
// checks the layout it finds is the one they were cut for.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom {

class unit_marker;
namespace comm {
class process_group;
}

namespace detail {

// How the strategy of an init_module(true) scope shards units.
struct construction_sharding {
  comm::process_group* group = nullptr;  // the shard group: each of its ranks builds every unit, in one order
  bool from_rank_zero = true;            // sync_module_states: each parameter is broadcast from rank 0 first
  // The dtype setup converts floating parameters to (DeepSpeed's 16-bit
  // mode): the shard is kept in it, as the whole module converted at setup
  // would give it; nullopt keeps the dtype the unit was built in.
  std::optional<at::ScalarType> dtype;
};

// What a unit's construction left for setup: this rank's shard of the
// unit's own parameters and those parameters (TensorImpl addresses), in order.
struct constructed_shard {
  at::Tensor shard;
  std::vector<const void*> parameters;
  std::int64_t numel = 0;  // the parameters' elements, before padding
  int shards = 0;
  int rank = 0;
};

// The scope fabric.init_module(true) opens on this thread; nested scopes
// restore the outer one. Not movable (the thread refers to it).
class construction_scope {
 public:
  explicit construction_scope(const construction_sharding* sharding) noexcept;
  ~construction_scope();
  construction_scope(const construction_scope&) = delete;
  construction_scope& operator=(const construction_scope&) = delete;

 private:
  construction_sharding sharding_;
  const construction_sharding* previous_;
};

// Called by unit<M> as its constructor returns (unit.hpp): shards the
// unit's own parameters when a scope is open on this thread. A collective
// over the scope's group (every rank builds the same units in the same order).
void unit_constructed(torch::nn::Module& unit, unit_marker& marker);

}  // namespace detail
}  // namespace loom
