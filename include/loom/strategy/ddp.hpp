// Distributed data parallel (Lightning's "ddp"): the parallel strategy plus
// bucketed, overlapped gradient all-reduce by c10d's Reducer, parameters and
// buffers broadcast from rank 0, a compile-time no_backward_sync, and the
// distributed sampler. PyTorch's DDP exists only in Python; this is it in C++.
#pragma once

#include <loom/compat.hpp>
#include <loom/strategy/ddp_engine.hpp>
#include <loom/strategy/live_engines.hpp>
#include <loom/strategy/no_sync_guard.hpp>
#include <loom/strategy/parallel.hpp>

#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

namespace loom {

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

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true) {
    comm::process_group& world = this->group();
    if (move_to_device) detail::move_module(module, this->device_);
    auto engine = std::make_shared<detail::ddp_engine>(module, world, options_);
    engines_.add(engine);
    return engine;
  }

  // Collectives the gradient engines of this strategy's live modules have
  // issued: one per bucket per synchronised backward (and, once per module,
  // the broadcast of its rebuilt bucket order). What accumulation under
  // no_backward_sync saves can be counted with it.
  std::uint64_t gradient_collectives() const {
    std::uint64_t total = 0;
    engines_.for_each([&](detail::ddp_engine& engine) { total += engine.collectives_issued(); });
    return total;
  }
  // The same collectives as the watchdog's recorder saw them (what proves
  // that the Reducer's all-reduces go through it).
  std::uint64_t gradient_collectives_recorded() const {
    std::uint64_t total = 0;
    engines_.for_each([&](detail::ddp_engine& engine) { total += engine.collectives_recorded(); });
    return total;
  }
  // Gradient buckets over the strategy's live modules.
  std::size_t gradient_buckets() const {
    std::size_t total = 0;
    engines_.for_each([&](detail::ddp_engine& engine) { total += engine.bucket_count(); });
    return total;
  }

  template <class Forward>
  auto forward(module_state& engine, torch::nn::Module& /*module*/, Forward&& run) {
    engine->before_forward();
    auto output = std::forward<Forward>(run)();
    std::vector<at::Tensor>& tensors = scratch_;
    tensors.clear();
    if (engine->options().find_unused_parameters) {
      for_each_tensor(output, [&tensors](const at::Tensor& t) { tensors.push_back(t); });
    }
    engine->after_forward(tensors);
    if (engine->needs_static_graph_sink()) {
      bool done = false;
      return apply_to_collection(std::move(output), [&](const at::Tensor& t) {
        if (done || !t.requires_grad()) return t;
        done = true;
        return engine->static_graph_sink(t);
      });
    }
    return output;
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
  ddp_options options_;
  std::vector<at::Tensor> scratch_;  // outputs handed to the reducer, reused every step
  detail::live_engines<detail::ddp_engine> engines_;  // for the counters above
};

// Lightning's preset "ddp_find_unused_parameters_true".
inline ddp ddp_find_unused_parameters_true() { return ddp(ddp_options{.find_unused_parameters = true}); }

static_assert(Strategy<ddp>);

}  // namespace loom
