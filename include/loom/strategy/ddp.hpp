// Distributed data parallel (Lightning's "ddp"): the parallel strategy plus
// bucketed, overlapped gradient all-reduce by c10d's Reducer, parameters and
// buffers broadcast from rank 0, a compile-time no_backward_sync, and the
// distributed sampler. PyTorch's DDP exists only in Python; this is it in C++.
#pragma once

#include <loom/compat.hpp>
#include <loom/strategy/ddp_options.hpp>
#include <loom/strategy/live_engines.hpp>
#include <loom/strategy/no_sync_guard.hpp>
#include <loom/strategy/parallel.hpp>

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace loom {

namespace detail {
// c10d's Reducer driven from C++ (ddp_engine.hpp, compiled in src/): the
// strategy reaches it through the calls below.
class ddp_engine;
bool sync_enabled(const ddp_engine& engine) noexcept;
void set_sync_enabled(ddp_engine& engine, bool enabled) noexcept;
}  // namespace detail

// The guard of fabric.no_backward_sync under DDP: backward passes inside it
// accumulate gradients locally; the next synced one reduces the sum.
using ddp_no_sync_guard = no_sync_guard<detail::ddp_engine>;

struct ddp : parallel {
  static constexpr std::string_view name = "ddp";
  static constexpr bool supports_no_backward_sync = true;

  // The reducer of each set-up module.
  using module_state = std::shared_ptr<detail::ddp_engine>;

  ddp() = default;
  explicit ddp(ddp_options options)
      : parallel(options.process),
        options_(options) {}

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true);

  // Collectives the gradient engines of this strategy's live modules have
  // issued: one per bucket per synchronised backward (and, once per module,
  // the broadcast of its rebuilt bucket order). What accumulation under
  // no_backward_sync saves can be counted with it.
  std::uint64_t gradient_collectives() const;
  // The same collectives as the watchdog's recorder saw them (what proves
  // that the Reducer's all-reduces go through it).
  std::uint64_t gradient_collectives_recorded() const;
  // Gradient buckets over the strategy's live modules.
  std::size_t gradient_buckets() const;

  template <class Forward>
  auto forward(module_state& engine, torch::nn::Module& /*module*/, Forward&& run) {
    before_forward(*engine);
    auto output = std::forward<Forward>(run)();
    std::vector<at::Tensor>& tensors = scratch_;
    tensors.clear();
    if (options_.find_unused_parameters) {
      for_each_tensor(output, [&tensors](const at::Tensor& t) { tensors.push_back(t); });
    }
    if (!after_forward(*engine, tensors)) return output;
    bool done = false;
    return apply_to_collection(std::move(output), [&](const at::Tensor& t) {
      if (done || !t.requires_grad()) return t;
      done = true;
      return static_graph_sink(*engine, t);
    });
  }

  ddp_no_sync_guard no_backward_sync(module_state& engine, bool enabled = true) {
    return ddp_no_sync_guard(*engine, enabled);
  }

  // With gradient_as_bucket_view, gradients are views into the buckets and
  // are zeroed in place even when set_to_none is asked: dropped, the next
  // backward would not write into the buckets (and 1.13 aborts). Every
  // parameter DDP reduces has a gradient after each backward anyway.
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) {
    compat::zero_grad(optimizer, set_to_none && !options_.gradient_as_bucket_view);
  }

  const ddp_options& options() const noexcept { return options_; }

 private:
  // The engine's side of forward (ddp_engine.hpp): before_forward, then
  // after_forward, which returns whether a static graph's first step needs
  // one differentiable output passed through static_graph_sink.
  static void before_forward(detail::ddp_engine& engine);
  static bool after_forward(detail::ddp_engine& engine, const std::vector<at::Tensor>& outputs);
  static at::Tensor static_graph_sink(detail::ddp_engine& engine, const at::Tensor& output);

  ddp_options options_;
  std::vector<at::Tensor> scratch_;  // outputs handed to the reducer, reused every step
  detail::live_engines<detail::ddp_engine> engines_;  // for the counters above
};

// Lightning's preset "ddp_find_unused_parameters_true".
inline ddp ddp_find_unused_parameters_true() { return ddp(ddp_options{.find_unused_parameters = true}); }

static_assert(Strategy<ddp>);

}  // namespace loom
