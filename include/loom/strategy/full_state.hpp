// The full-state scope, written once for every sharded strategy: body runs
// with every split parameter (and the optimizers' state of it) full-sized,
// then each rank keeps its part again. fsdp's, deepspeed's and
// model_parallel's full checkpoints and model_parallel's loads go through
// it; fsdp's and deepspeed's loads read each rank's parts in place
// (load_local_state). The parameters' placements (placement.hpp) say how to
// gather and slice.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/state.hpp>
#include <loom/comm/process_group.hpp>
#include <loom/strategy/fsdp_engine_calls.hpp>
#include <loom/strategy/placement.hpp>
#include <loom/util/module_fwd.hpp>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace torch::optim {
class Optimizer;
}

namespace loom::detail {

// The placement of every parameter of the engines' modules and of `modules`
// (each once, tied ones included), in an order every rank shares: the
// engines' flat slices composed with the chunks of the tensor-parallel
// layers they contain.
std::vector<placement> placements_of(const std::vector<std::weak_ptr<fsdp_engine>>& engines,
                                     const std::vector<const torch::nn::Module*>& modules);

// Runs body with the parameters of placements_of(engines, modules), and each
// per-parameter state tensor of `optimizers` for them (exp_avg,
// momentum_buffer, ...), full-sized. Collective: every rank calls it with
// the same arguments. Only where `keeps` does body see full tensors (a save
// that one rank writes: the others take part in the gathers, one parameter at
// a time, and hold nothing). Each rank's parts come back after, also when
// body throws; what body changed is not kept (loads go through
// load_local_state). An engine's shard store holds its shards in memory
// meanwhile.
void with_full_state(const std::vector<std::weak_ptr<fsdp_engine>>& engines,
                     const std::vector<const torch::nn::Module*>& modules,
                     const std::vector<torch::optim::Optimizer*>& optimizers, bool keeps,
                     const std::function<void()>& body);

// A load in place of this rank's parts (load_local_parts): every split or
// engine-owned parameter of placements_of(engines, target's modules) keeps
// its part, and the checkpoint's elements of it are read straight into that
// part's shape; the optimizers' state of it comes in at the part's size.
// Nothing is gathered and nothing full-sized is held. Collective over group;
// all ranks load or none does.
state load_local_state(const std::vector<std::weak_ptr<fsdp_engine>>& engines, const state& target,
                       const std::string& path, bool strict, comm::process_group& group);

// A full save of `target` by rank `root` of group (save_gathered_checkpoint):
// each split or engine-owned parameter of placements_of(engines, target's
// modules), and its optimizer state, gathered one tensor at a time as its
// record is written (the root holds its state and one full tensor, the
// others one full tensor). Collective over group.
void save_gathered_state(const std::vector<std::weak_ptr<fsdp_engine>>& engines, const state& target,
                         const state_filter& filter, const checkpoint_metadata& metadata, const std::string& path,
                         int root, comm::process_group& group);

}  // namespace loom::detail
