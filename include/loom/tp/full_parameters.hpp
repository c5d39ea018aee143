// Tensor-parallel parameters at full size, for checkpoints: a full save
// gathers every chunk along its dimension over the tensor-parallel group (and
// the optimizers' state of those parameters with it), writes, and puts the
// chunks back; a load makes the parameters full-sized, loads, and keeps this
// rank's chunk. A distributed save names each chunk instead
// (sharded_parameters_of), so a sharded checkpoint reassembles them.
#pragma once

#include <loom/comm/process_group.hpp>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::tp {

// A parameter that a plan chunked: its name in the module's state dict, the
// tensor, and the dimension (this rank holds chunk(group size, dim)[group rank]).
struct named_chunk {
  std::string name;
  at::Tensor parameter;
  int64_t dim = 0;
};
std::vector<named_chunk> sharded_parameters_of(const torch::nn::Module& module);

// Runs body with the chunked parameters of `modules`, and every per-parameter
// state tensor of `optimizers` for them (exp_avg, momentum_buffer, ...),
// all-gathered to full size over `group` (collective: every rank of the
// group calls it with the same modules). With write_back, each rank then
// keeps its chunk of what body left (a load); without, the chunks it had
// come back. Also when body throws.
void with_full_parameters(const std::vector<const torch::nn::Module*>& modules, const comm::process_group& group,
                          const std::vector<torch::optim::Optimizer*>& optimizers, const std::function<void()>& body,
                          bool write_back);

}  // namespace loom::tp
