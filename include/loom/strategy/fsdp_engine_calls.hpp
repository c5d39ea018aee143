// What a strategy calls on the sharding engine (fsdp_engine.hpp, compiled in
// src/): its forward around a set-up module's, the switch no_backward_sync
// turns, and its counters. The strategies' headers include this, not the
// engine, so a TU that includes a strategy parses none of its internals.
#pragma once

#include <loom/util/apply_to_collection.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>

namespace loom::detail {

class fsdp_engine;

// Counters a test reads (collectives the engine issued).
struct fsdp_counters {
  std::uint64_t all_gathers = 0;      // parameter gathers (forward, backward, prefetched)
  std::uint64_t reduce_scatters = 0;  // gradient reductions over the shard group
  std::uint64_t all_reduces = 0;      // gradient reductions over the replicate group
  std::uint64_t prefetches = 0;       // gathers issued ahead of the unit's use
  std::uint64_t offload_to_device = 0;  // cpu_offload: a parameter shard moved to the compute device for a gather
  std::uint64_t offload_to_host = 0;    // cpu_offload: a reduced gradient shard moved back to the host
};

// The engine around the wrapped module's forward: the root unit (parameters
// outside every sub-unit) is gathered for the whole forward and its backward,
// and the outputs are watched for the backward.
void root_pre_forward(fsdp_engine& engine);
void root_watch_output(fsdp_engine& engine, const at::Tensor& output);
void root_post_forward(fsdp_engine& engine);

// no_backward_sync's switch (no_sync_guard.hpp).
bool sync_enabled(const fsdp_engine& engine) noexcept;
void set_sync_enabled(fsdp_engine& engine, bool enabled) noexcept;

// A set-up module's forward under the engine: the root unit gathered around
// it, its outputs watched for the backward (fsdp and model_parallel's
// data-parallel dimension).
template <class Forward>
auto forward_through(fsdp_engine& engine, Forward&& run) {
  root_pre_forward(engine);
  auto output = std::forward<Forward>(run)();
  for_each_tensor(output, [&engine](const at::Tensor& t) { root_watch_output(engine, t); });
  root_post_forward(engine);
  return output;
}

}  // namespace loom::detail
