// A unit as the sharding engine keeps it (fsdp_engine.cpp), and the two
// states it moves through, as PyTorch's FSDP2 names them
// (_fsdp_param_group.py: TrainingState, ShardedState):
//
//   training   idle --pre_forward--> forward --post_forward--> idle
//              idle --first output hook of a backward--> backward
//              backward --its last gradient, or the backward's end--> reduced
//              reduced --the backward's end--> idle
//              any --recovery at the root's pre-forward--> idle
//   sharded    sharded --issue_gather--> gathering --wait--> gathered
//              gathered --point_full--> unsharded --point_shard--> gathered
//              gathered --release--> sharded (FULL_SHARD empties the storage;
//              SHARD_GRAD_OP keeps it allocated, its contents stale)
//
// Each move checks the state it starts from (move_training, move_sharded):
// a move from any other is loom's bug, reported as such, never carried out
// on state that does not allow it. Over one rank nothing is sharded: the
// buffer is the shard, and a unit moves between gathered and unsharded only.
#pragma once

#include <loom/comm/work.hpp>
#include <loom/strategy/fsdp_engine.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch::autograd {
struct Node;
}
namespace torch::nn {
class Module;
}

namespace loom {
class unit_marker;
}

namespace loom::detail {

enum class training_state : std::uint8_t { idle, forward, backward, reduced };
enum class sharded_state : std::uint8_t { sharded, gathering, gathered, unsharded };

const char* to_string(training_state state) noexcept;
const char* to_string(sharded_state state) noexcept;

// One parameter of a unit.
struct unit_parameter {
  at::Tensor param;                  // the user's leaf; its data is re-pointed
  std::vector<std::string> names;    // every dotted name it has (shared parameters have several)
  std::vector<int64_t> shape;
  int64_t numel = 0;
  int64_t offset = 0;                // in the unit's flat buffer
  at::Tensor full_view, grad_view;   // param-shaped, over the gathered buffers
  at::Tensor shard_view, grad_shard_view;  // this rank's slice (1-D; param-shaped when nothing is sharded)
  int64_t local_offset = 0;          // where shard_view starts inside the flat buffer
  std::shared_ptr<torch::autograd::Node> accumulator;
  std::uintptr_t hook_key = 0;
  bool requires_grad = true;
};

struct sharded_unit {
  // The engine, for the module's unit_marker (which the engine detaches
  // before it goes); autograd's hooks hold the engine weakly instead.
  fsdp_engine::impl* engine = nullptr;
  std::string name;
  // Held: the engine outlives no module it re-pointed (the root included).
  std::shared_ptr<torch::nn::Module> module;
  unit_marker* marker = nullptr;  // nullptr: the root, or a plain module chosen by auto_wrap_policy
  int index = 0;
  int parent = -1;                // the innermost unit above it
  std::vector<unit_parameter> params;
  int64_t numel = 0, padded = 0, shard_numel = 0;
  int partition = -1;             // its index among the units with parameters (a shard_store's key)
  at::Tensor shard, grad_shard, reduced;  // reduced: a fresh reduction, added when gradients accumulate
  at::Tensor full, full_grad;             // storages emptied between uses (aliases of shard/grad_shard when unsharded)
  at::Tensor low_in, low_out;             // a reduction in reduce_dtype: the gradients converted, and the result
  comm::work gather;
  comm::work reduction;

  training_state training = training_state::idle;
  sharded_state sharding = sharded_state::sharded;
  bool reduction_pending = false;
  bool grads_live = false;        // full_grad holds gradients (accumulating under no_backward_sync)
  // grad_shard's storage comes with the first backward (or partitions()):
  // setup holds no gradient, as torch's FSDP allocates them in backward.
  bool grad_shard_pending = false;
  bool had_grad = false;          // the reduced shard is added to the gradients already there
  bool checkpoint = false;        // activation checkpointing: the forward is recomputed in backward
  int grads_expected = 0;
  int grads_seen = 0;
  int watched_outputs = 0;
  int forward_position = -1;

  bool full_valid() const noexcept {
    return sharding == sharded_state::gathered || sharding == sharded_state::unsharded;
  }
};

// The moves of the diagram above: `to` from `from`, or std::logic_error
// naming the unit, the move and the state it was in.
void move_training(sharded_unit& unit, training_state from, training_state to);
void move_sharded(sharded_unit& unit, sharded_state from, sharded_state to);

}  // namespace loom::detail
