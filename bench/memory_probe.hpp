// What a sharded strategy keeps per rank, measured two ways (bench/fsdp_memory,
// bench/zero_memory):
//   held (a): the distinct storages reachable from the module (parameters,
//     gradients), the optimizer (its state) and the engine (flat shards,
//     gathered buffers), each counted once;
//   held (b): the live bytes of loom::counting_allocator (installed before
//     anything else), minus its count before the model was built;
// and the peaks of one step and of build + setup, with the RSS high-water
// mark of each phase (VmHWM, reset through clear_refs).
#pragma once

#include "fsdp_model.hpp"

#include <loom/strategy/fsdp_engine.hpp>  // the engines' own buffers, counted
#include <loom/strategy/nvme_stream.hpp>
#include <loom/util/counting_allocator.hpp>
#include <loom/util/rss_peak.hpp>

#include <torch/nn/functional/loss.h>
#include <torch/optim/adam.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <string>

namespace loom_bench {

using loom::counting_allocator;
using loom::install_counting_allocator;

using loom::reset_rss_peak;
using loom::rss_peak_bytes;

inline double mib(std::int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

// /proc/self/io's read_bytes and write_bytes: what reached the block layer
// (direct I/O included; a page-cache hit is not counted).
struct io_bytes {
  std::int64_t read = 0, written = 0;
};
inline io_bytes process_io() {
  std::ifstream in("/proc/self/io");
  std::string key;
  std::int64_t value = 0;
  io_bytes out;
  while (in >> key >> value) {
    if (key == "read_bytes:") out.read = value;
    if (key == "write_bytes:") out.written = value;
  }
  return out;
}

struct memory_probe {
  std::int64_t held_a = 0, held_b = 0;
  std::int64_t nvme_buffer_bytes = 0;    // ZeRO's NVMe stream: its buffers
  std::int64_t nvme_group_bytes = 0;     // one sub-group's state
  std::int64_t nvme_sub_groups = 0;
  std::int64_t partition_elements = 0;   // this rank's flat partitions
  bool optimizer_state_empty = false;    // the optimizer object keeps no state
  io_bytes last_step_io;                 // /proc/self/io during the last step
  std::int64_t padding = 0;  // elements of padding in the flat buffers
  std::int64_t step_peak = 0, step_rss = 0, setup_peak = 0, setup_rss = 0;
};

// Builds WideMlp with fp32 Adam under fabric (a sharded strategy), takes
// three steps (Adam's state exists from the first), and measures.
// empty_init: the model is built inside fabric.init_module(true) (sharded
// construction where the strategy has it).
template <class F>
memory_probe probe_memory(F& fabric, counting_allocator& counter, const at::Tensor& inputs, const at::Tensor& targets,
                          bool empty_init = false) {
  memory_probe out;
  fabric.barrier();
  const std::int64_t before = counter.live();
  counter.reset_peak();
  reset_rss_peak();
  at::manual_seed(0);
  WideMlp net = [&] {
    auto guard = fabric.init_module(empty_init);
    return WideMlp();
  }();
  torch::optim::Adam adam(net->parameters(), torch::optim::AdamOptions(1e-3));
  auto [model, optimizer] = fabric.setup(net, adam);
  out.setup_peak = counter.peak() - before;
  out.setup_rss = rss_peak_bytes();
  auto step = [&] {
    optimizer.zero_grad();
    fabric.backward(torch::nn::functional::cross_entropy(model(inputs), targets));
    optimizer.step();
  };
  for (int s = 0; s < 3; ++s) step();
  out.held_b = counter.live() - before;
  std::set<const void*> seen;
  auto count = [&](const at::Tensor& t) {
    if (!t.defined()) return;
    if (seen.insert(t.storage().unsafeGetStorageImpl()).second) out.held_a += static_cast<std::int64_t>(t.storage().nbytes());
  };
  for (const auto& p : net->parameters()) {
    count(p);
    count(p.grad());
  }
  for (const auto& [key, per_parameter] : adam.state()) {
    const auto& s = static_cast<const torch::optim::AdamParamState&>(*per_parameter);
    count(s.exp_avg());
    count(s.exp_avg_sq());
    count(s.max_exp_avg_sq());
  }
  auto& engine = *model.session().state();
  for (const auto& t : engine.held_tensors()) count(t);
  if constexpr (requires { fabric.strategy().master_tensors(); }) {
    for (const auto& t : fabric.strategy().master_tensors()) count(t);  // ZeRO's fp32 masters under bf16
    if (const auto* stream = fabric.strategy().nvme()) {                 // ZeRO's NVMe buffers
      out.nvme_buffer_bytes = stream->counters().buffer_bytes;
      out.nvme_group_bytes = stream->counters().state_bytes_per_sub_group;
      out.nvme_sub_groups = static_cast<std::int64_t>(stream->counters().sub_groups);
      for (const auto& t : stream->buffers()) out.held_a += static_cast<std::int64_t>(t.numel()) * 4 + 4096;
    }
  }
  for (const auto& [p, g] : engine.partitions()) out.partition_elements += p.numel();
  out.optimizer_state_empty = adam.state().empty();
  for (const auto& unit : engine.units()) out.padding += unit.padded - unit.numel;
  counter.reset_peak();
  reset_rss_peak();
  const io_bytes io_before = process_io();
  step();
  const io_bytes io_after = process_io();
  out.last_step_io = {io_after.read - io_before.read, io_after.written - io_before.written};
  out.step_peak = counter.peak() - before - out.held_b;
  out.step_rss = rss_peak_bytes();
  return out;
}

}  // namespace loom_bench
