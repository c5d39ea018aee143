// The static Fabric's backend: the three policies as types, every call
// resolved by the compiler. basic_fabric<static_backend<A, S, P>> is
// Fabric<A, S, P>; runtime/fabric_model.hpp erases one for AnyFabric.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/state.hpp>
#include <loom/cluster/launcher_agreement.hpp>
#include <loom/comm/process_group.hpp>
#include <loom/compatibility.hpp>
#include <loom/concepts.hpp>
#include <loom/errors.hpp>
#include <loom/fabric_options.hpp>
#include <loom/strategy/unit_construction.hpp>
#include <loom/util/decided.hpp>
#include <loom/wrap/strategy_session.hpp>

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>

namespace loom {

// init_module's guard: the precision's, then sharded construction's scope.
template <class PrecisionGuard>
struct [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] module_init_guard {
  PrecisionGuard precision;
  detail::construction_scope construction;
};

namespace detail {
template <class A, class S, class P>
constexpr bool diagnose_fabric() {
  if constexpr (!diagnose_accelerator<A>()) return false;
  else if constexpr (!diagnose_strategy<S>()) return false;
  else if constexpr (!diagnose_precision<P>()) return false;
  else return diagnose_combination<A, S, P>();
}
}  // namespace detail

template <class A, class S, class P>
class static_backend {
  // First, so a wrong combination reports what to do before anything else.
  static_assert(detail::diagnose_fabric<A, S, P>());

 public:
  using session_type = strategy_session<S, P, A::device_type>;
  using stepper_type = strategy_stepper<S, P>;
  static constexpr decided joint_setup = decided_from(needs_joint_setup<S>);
  static constexpr decided distributed_sampler = decided_from(needs_distributed_sampler<S>);
  static constexpr decided skip_backward_sync = decided_from(loom::supports_no_backward_sync<S>);

  static_backend(const fabric_options& options, S strategy, P precision)
      : strategy_(std::move(strategy)), precision_(std::move(precision)) {
    if (options.num_nodes < 1) {
      throw configuration_error("num_nodes=" + std::to_string(options.num_nodes) + " is not valid: it must be >= 1");
    }
    // Started by loom-run: its --accelerator/--strategy/--precision/--devices must agree with this type.
    if (!options.checked_by_connector) {
      const std::string conflict = cluster::launcher_conflict(
          A::name, S::name, P::name,
          options.devices.given() ? std::optional<std::string>(options.devices.text()) : std::nullopt,
          options.num_nodes, options.num_nodes != 1);
      if (!conflict.empty()) throw configuration_error(conflict);
    }
    strategy_environment environment;
    environment.requested = options.devices;
    environment.parse_devices = &A::parse_devices;
    environment.device_of = &A::device;
    environment.accelerator = A::name;
    environment.strategy = S::name;
    environment.precision = precision_dtypes_of<P>();
    environment.num_nodes = options.num_nodes;
    strategy_.setup_environment(environment);
  }
  // Sessions and steppers point into this object.
  static_backend(const static_backend&) = delete;
  static_backend& operator=(const static_backend&) = delete;

  S& strategy() noexcept { return strategy_; }
  const S& strategy() const noexcept { return strategy_; }
  P& precision() noexcept { return precision_; }
  const P& precision() const noexcept { return precision_; }

  std::string_view accelerator_name() const noexcept { return A::name; }
  std::string_view strategy_name() const noexcept { return S::name; }
  std::string_view precision_name() const noexcept { return P::name; }
  // The answers when at_run_time (never here: the facade asks the constants).
  static constexpr bool needs_joint_setup() noexcept { return joint_setup == decided::always; }
  static constexpr bool needs_distributed_sampler() noexcept { return distributed_sampler == decided::always; }
  static constexpr bool supports_no_backward_sync() noexcept { return skip_backward_sync == decided::always; }

  void launch() {
    if constexpr (launches_processes<S>) strategy_.launch();
  }
  bool is_forked_child() const noexcept {
    if constexpr (launches_processes<S>) return strategy_.is_forked_child();
    else return false;
  }
  int global_rank() const { return strategy_.global_rank(); }
  int local_rank() const { return strategy_.local_rank(); }
  int node_rank() const { return strategy_.node_rank(); }
  int world_size() const { return strategy_.world_size(); }
  // Who a distributed sampler deals batches to: the world, unless the
  // strategy says otherwise (model_parallel: its data-parallel ranks).
  int sampler_replicas() {
    if constexpr (sets_sampler_ranks<S>) return strategy_.sampler_replicas();
    else return strategy_.world_size();
  }
  int sampler_rank() {
    if constexpr (sets_sampler_ranks<S>) return strategy_.sampler_rank();
    else return strategy_.global_rank();
  }
  c10::Device device() const { return strategy_.root_device(); }

  session_type setup_module(torch::nn::Module& module, bool move_to_device) {
    precision_.convert_module(module);
    return session_type(strategy_, precision_, strategy_.setup_module(module, move_to_device));
  }
  session_type setup_module_jointly(torch::nn::Module& module, std::span<torch::optim::Optimizer* const> optimizers) {
    precision_.convert_module(module);
    return session_type(strategy_, precision_,
                        strategy_.setup_module_and_optimizers(module, optimizers, /*move_to_device=*/true));
  }
  // The stepper of the next optimizer set up, and its slot (the precision
  // keeps per-optimizer state by slot).
  stepper_type stepper() noexcept { return stepper_type(strategy_, precision_); }
  optimizer_slot next_optimizer_slot(torch::optim::Optimizer& /*optimizer*/) noexcept {
    return optimizer_slot{next_optimizer_slot_++};
  }
  void unscale_gradients(torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    precision_.unscale_gradients(optimizer, slot);
  }
  // Through the strategy (an engine may own backward), which asks the
  // precision to scale the loss.
  void backward(const at::Tensor& loss) { strategy_.backward(precision_, loss); }

  auto autocast() const { return precision_.forward_context(A::device_type); }
  auto init_context() const { return precision_.init_context(); }
  // fabric.init_module(empty_init): the precision's dtype and, with
  // empty_init under a strategy that shards units as they are built
  // (construction_sharding(): fsdp FULL_SHARD, deepspeed stage 3), that scope.
  auto init_module_context(bool empty_init) const {
    std::optional<detail::construction_sharding> sharding;
    if constexpr (requires { strategy_.construction_sharding(); }) {
      if (empty_init) sharding = strategy_.construction_sharding();
    }
    return module_init_guard<decltype(precision_.init_context())>{
        precision_.init_context(), detail::construction_scope(sharding ? &*sharding : nullptr)};
  }

  // The strategy's collectives take a tensor or a nested container of them.
  void barrier() { strategy_.barrier(); }
  template <class T>
  auto all_reduce(T&& value, reduce_op op) {
    return strategy_.all_reduce(std::forward<T>(value), op);
  }
  void all_reduce_(at::Tensor& tensor, reduce_op op) { strategy_.all_reduce_(tensor, op); }
  template <class T>
  auto all_gather(T&& value, bool sync_grads) {
    return strategy_.all_gather(std::forward<T>(value), sync_grads);
  }
  template <class T>
  auto all_gather_per_rank(T&& value) {
    return strategy_.all_gather_per_rank(std::forward<T>(value));
  }
  template <class T>
  auto broadcast(T&& value, int source) {
    return strategy_.broadcast(std::forward<T>(value), source);
  }
  template <class T>
  auto reduce_scatter(T&& value, reduce_op op) {
    return strategy_.reduce_scatter(std::forward<T>(value), op);
  }
  c10::IValue broadcast_object(const c10::IValue& value, int source) {
    return strategy_.broadcast_object(value, source);
  }
  bool reduce_boolean_decision(bool decision, bool all) { return strategy_.reduce_boolean_decision(decision, all); }

  // The strategy decides who writes what; under 16-mixed the scaler's state
  // is added as "precision". Ranks wait on one another's files here (rank
  // 0 alone writes a full save): the collective watchdog stands down, and
  // the group's own timeout bounds the waits.
  void save(const std::string& path, const state& checkpoint, const state_filter& filter) {
    const comm::watchdog_pause paused;
    strategy_.save_checkpoint(path, with_precision(checkpoint), filter, metadata());
  }
  state load(const std::string& path, const state& checkpoint, bool strict) {
    const comm::watchdog_pause paused;
    return strategy_.load_checkpoint(path, with_precision(checkpoint), strict);
  }

 private:
  state with_precision(const state& checkpoint) {
    state full = checkpoint;
    if constexpr (has_precision_state<P>) {
      if (!full.contains("precision")) {
        state_entry entry("precision", precision_);
        full.add(std::move(entry.optional()));
      }
    }
    return full;
  }

  checkpoint_metadata metadata() const {
    checkpoint_metadata meta;
    meta.world_size = strategy_.world_size();
    meta.global_rank = strategy_.global_rank();
    meta.strategy = std::string(S::name);
    meta.precision = std::string(P::name);
    return meta;
  }

  S strategy_;
  P precision_;
  int next_optimizer_slot_ = 0;
};

}  // namespace loom
