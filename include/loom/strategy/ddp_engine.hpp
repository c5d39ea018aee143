// The gradient synchroniser behind loom::ddp: c10d::Reducer (the engine of
// Python's DDP) driven from C++. Buckets in reverse parameter order (1 MiB
// first, then bucket_cap_mb), filled as autograd produces gradients, each
// all-reduced asynchronously while backward goes on, averaged by the world
// size, waited on at the end of backward. Compiled once in src/.
#pragma once

#include <loom/comm/process_group.hpp>
#include <loom/strategy/ddp_options.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace torch::nn {
class Module;
}

namespace loom {

namespace detail {

class ddp_engine {
 public:
  // Broadcasts the module's parameters and buffers from rank 0, plans the
  // buckets and builds the reducer on a process group of its own (made from
  // `world`, a collective), so its all-reduces never interleave with the
  // user's collectives and can be counted.
  ddp_engine(torch::nn::Module& module, comm::process_group& world, const ddp_options& options);
  ddp_engine(const ddp_engine&) = delete;
  ddp_engine& operator=(const ddp_engine&) = delete;
  ~ddp_engine();

  void before_forward();
  // Arms the reducer for this step's backward (unless sync is off).
  void after_forward(const std::vector<at::Tensor>& outputs);

  // A static graph's first step runs its all-reduce after backward (the
  // reducer is learning the graph): one differentiable output is passed
  // through a sink whose backward schedules it.
  bool needs_static_graph_sink() const noexcept;
  at::Tensor static_graph_sink(const at::Tensor& output);

  bool sync_enabled() const noexcept;
  void set_sync_enabled(bool enabled) noexcept;

  std::size_t bucket_count() const;
  // Gradient reductions and other collectives issued on the engine's group
  // since it formed: one per bucket per synced backward (and, once, the
  // broadcast of the rebuilt bucket order).
  std::uint64_t collectives_issued() const;
  // The same, as the collective watchdog's recorder saw them go through the
  // c10d group (0 with the watchdog off).
  std::uint64_t collectives_recorded() const;
  const ddp_options& options() const noexcept;

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace detail
}  // namespace loom
