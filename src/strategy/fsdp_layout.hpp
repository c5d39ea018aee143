// The sharding engine's units as setup lays them out (fsdp_engine.cpp):
// - discovery: which modules are units (the root, every loom::unit<M>, what
//   auto_wrap_policy chooses), each with the innermost unit above it;
// - ownership: each parameter once, in the innermost unit that contains every
//   module registering it (a weight tied across units moves up, said on
//   stderr by rank 0);
// - flattening: each unit's parameters in one flat buffer padded to a
//   multiple of the shard count (rank 0's values where sync_module_states),
//   this rank keeping its shard (or adopting the one sharded construction
//   left), every parameter re-pointed at its slice, its AccumulateGrad made
//   while it is full-sized (autograd checks gradients against that shape).
// What it leaves: units in the sharded state, gradient hooks not yet added.
#pragma once

#include "fsdp_comm.hpp"
#include "fsdp_unit.hpp"

#include <loom/comm/process_group.hpp>
#include <loom/strategy/fsdp_options.hpp>

#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom::detail {

// Collective over world when sync_module_states (each unit's buffer is
// broadcast from rank 0). units()[0] is the root.
std::vector<std::unique_ptr<sharded_unit>> lay_out_units(torch::nn::Module& root, const fsdp_options& options,
                                                         fsdp_comm& comm, comm::process_group& world);

}  // namespace loom::detail
