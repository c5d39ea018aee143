// Sharded construction: inside fabric.init_module(true) (Lightning's
// empty_init=True) under a strategy that shards at construction (fsdp
// FULL_SHARD and HYBRID_SHARD, deepspeed stage 3, model_parallel), each
// loom::unit<M> keeps only this rank's shard of its own parameters the
// moment its constructor returns, so a model larger than one process can be
// built unit by unit. Every rank builds each unit whole, in constructor
// order, with the same seed (CPU generators cannot skip ahead), takes rank
// 0's values (sync_module_states) and keeps its slice of the unit's flat
// buffer, laid out as the sharding engine lays units out: the unit's own
// parameters (those of nested units are theirs) in module order, padded to
// a multiple of the world's size. Until setup, each such parameter is a
// placeholder of its shape over one NaN (one element): a forward before
// setup computes NaN.
//
// Setup adopts a shard whose layout is the engine's (FULL_SHARD, ZeRO-3:
// the same world, the same rank). Where the engine lays the unit out
// otherwise (HYBRID_SHARD's shard group, model_parallel's tensor-parallel
// chunks sharded again over the data-parallel group), the unit is gathered
// whole over the world once, as setup reaches it, each parameter keeps what
// the rank holds of it (its tensor-parallel chunk, or all of it) and the
// engine shards that: setup holds one unit whole at a time.
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

// A parameter that keeps chunk(parts, dim)[part] of its full tensor (a
// tensor-parallel layer's); parts 1: all of it.
struct kept_chunk {
  std::int64_t dim = 0;
  int parts = 1;
  int part = 0;
};

// What a unit's construction left for setup: this rank's shard of the
// unit's own parameters and those parameters (TensorImpl addresses), in order.
struct constructed_shard {
  at::Tensor shard;
  std::vector<const void*> parameters;
  std::vector<std::vector<std::int64_t>> shapes;  // each parameter's full shape
  std::vector<kept_chunk> kept;                   // what of each this rank keeps at setup
  std::int64_t numel = 0;                         // the parameters' elements, before padding
  int shards = 0;
  int rank = 0;
  comm::process_group* group = nullptr;  // the construction's (the strategy's world; it outlives setup)
};

// Gives the unit's parameters (the ones it was cut from, in order) their
// values again, each the part of its full tensor this rank keeps, and drops
// the shard: one all-gather of the unit over the construction's group, so
// every rank of it calls this for the same units in the same order.
void gather_constructed(unit_marker& marker, const std::vector<at::Tensor>& parameters);

// After a tensor-parallel plan ran over `module`: each constructed unit's
// parameters that a layer now holds a chunk of keep that chunk at setup.
void note_tensor_parallel_chunks(torch::nn::Module& module);

// Gathers (gather_constructed) every unit of `module` still holding a
// construction shard, in module order: setup where no engine shards them.
void gather_all_constructed(torch::nn::Module& module);

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
