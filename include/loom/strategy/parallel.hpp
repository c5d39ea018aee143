// Lightning's ParallelStrategy, usable on its own: several processes with
// ranks, a process group and collectives, and no gradient synchronisation
// (for codes that synchronise themselves). DDP refines it.
#pragma once

#include <loom/strategy/collectives.hpp>
#include <loom/strategy/process_options.hpp>
#include <loom/strategy/strategy_base.hpp>

#include <memory>
#include <string_view>

namespace loom {

namespace detail {
// The processes, ranks and world group (distributed_runtime.hpp, compiled
// in src/): a strategy reaches it through the calls below, so a TU that
// includes a strategy does not parse the launcher.
class distributed_runtime;
}  // namespace detail

struct parallel : strategy_base {
  static constexpr std::string_view name = "parallel";
  static constexpr bool is_distributed = true;
  static constexpr bool needs_distributed_sampler = true;
  // Nothing is synchronised, so there is nothing to skip: the guard is empty.
  static constexpr bool supports_no_backward_sync = true;
  static constexpr bool launches_processes = true;  // launch(), is_forked_child()

  parallel() = default;
  explicit parallel(parallel_options options) : options_(options) {}

  void setup_environment(const strategy_environment& environment);
  const parallel_options& parallel_settings() const noexcept { return options_; }

  int world_size() const noexcept;
  int global_rank() const noexcept;
  int local_rank() const noexcept;
  int node_rank() const noexcept;
  bool is_global_zero() const noexcept { return global_rank() == 0; }

  void launch();
  bool is_forked_child() const noexcept;

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true) {
    (void)group();  // processes must exist before their modules do anything collective
    if (move_to_device) detail::move_module(module, device_);
    return {};
  }

  no_context no_backward_sync(module_state& /*state*/, bool /*enabled*/ = true) { return {}; }

  // One file, written by global rank zero; every rank returns once it is in place.
  void save_checkpoint(const std::string& path, const state& checkpoint, const state_filter& filter,
                       const checkpoint_metadata& metadata) {
    if (global_rank() == 0) loom::save_checkpoint(path, checkpoint, filter, metadata);
    barrier();
  }

  comm::process_group& group();
  detail::distributed_runtime& runtime() { return *runtime_; }

  // ------------------------------------------------------------ collectives
  void barrier() { group().barrier(); }

  template <class T>
  auto all_reduce(T&& value, reduce_op op = reduce_op::sum) {
    return collectives::all_reduce(group(), std::forward<T>(value), op);
  }
  void all_reduce_(at::Tensor& tensor, reduce_op op = reduce_op::sum) { group().all_reduce(tensor, op); }
  template <class T>
  auto all_gather(T&& value, bool sync_grads = false) {
    return collectives::all_gather(group(), std::forward<T>(value), sync_grads);
  }
  template <class T>
  auto all_gather_per_rank(T&& value) {
    return collectives::all_gather_per_rank(group(), std::forward<T>(value));
  }
  template <class T>
  auto broadcast(T&& value, int source = 0) {
    return collectives::broadcast(group(), std::forward<T>(value), source);
  }
  template <class T>
  auto reduce_scatter(T&& value, reduce_op op = reduce_op::sum) {
    return collectives::reduce_scatter(group(), std::forward<T>(value), op);
  }
  c10::IValue broadcast_object(const c10::IValue& value, int source = 0) {
    return group().broadcast_object(value, source);
  }
  bool reduce_boolean_decision(bool decision, bool all = true) {
    return collectives::reduce_boolean_decision(group(), decision, all);
  }
  comm::process_group new_group(const std::vector<int>& ranks) { return group().new_group(ranks); }

 protected:
  // For a const member that hands the world group on (init_module's scope).
  comm::process_group& world_group() const;

 private:
  parallel_options options_;
  std::shared_ptr<detail::distributed_runtime> runtime_;
};

static_assert(Strategy<parallel>);

}  // namespace loom
