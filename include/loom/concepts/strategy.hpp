// The Strategy contract, in layers (stdexec style): processes and ranks ->
// module setup and forward -> the training step -> checkpoints ->
// collectives. Each layer refines the one before; diagnose_strategy walks the
// members in that order and stops at the first missing one with a sentence
// that says what to add. The capability traits a strategy states live here
// too, since the contract depends on them (no_backward_sync where supported,
// a joint setup where required).
#pragma once

#include <loom/comm/reduce_op.hpp>
#include <loom/concepts/base.hpp>
#include <loom/concepts/compatibility_rules.hpp>
#include <loom/concepts/precision_dtypes.hpp>
#include <loom/devices.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <concepts>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace loom {

class state;
struct checkpoint_metadata;
struct clip_options;
// Per entry, which items of a module's state dict to save (as checkpoint/state.hpp).
using state_filter = std::map<std::string, std::function<bool(std::string_view key, const at::Tensor& value)>>;

// What Fabric hands its strategy: the devices as the user asked for them and
// the accelerator's functions to resolve them (the strategy knows its local
// rank, and so which device is its own, only after reading its environment).
struct strategy_environment {
  devices_spec requested;
  device_selection (*parse_devices)(const devices_spec&) = nullptr;
  c10::Device (*device_of)(const device_selection&, int local_rank) = nullptr;
  std::string_view accelerator;
  std::string_view strategy;
  precision_dtypes precision;  // the Fabric's precision (sharded strategies choose their dtypes from it)
  int num_nodes = 1;
};

// ---------------------------------------------------------------------------
// Capability traits. A strategy states them as static constexpr members; the
// traits read them with safe defaults so a minimal strategy still works.
// ---------------------------------------------------------------------------
// Whether the strategy runs forward itself from its arguments (dp: a replica
// per device): wrapped modules then call forward_replicas, not forward.
template <class S>
inline constexpr bool replicates_forward = [] {
  if constexpr (requires { S::replicates_forward; }) return bool(S::replicates_forward);
  else return false;
}();

template <class S>
inline constexpr bool supports_no_backward_sync = [] {
  if constexpr (requires { S::supports_no_backward_sync; }) return bool(S::supports_no_backward_sync);
  else return false;
}();

template <class S>
inline constexpr bool is_distributed = [] {
  if constexpr (requires { S::is_distributed; }) return bool(S::is_distributed);
  else return false;
}();

template <class S>
inline constexpr bool is_sharded = [] {
  if constexpr (requires { S::is_sharded; }) return bool(S::is_sharded);
  else return false;
}();

// Whether setup_dataloaders must insert a distributed sampler (so a loader the
// user built, whose sampler loom cannot replace, is refused).
template <class S>
inline constexpr bool needs_distributed_sampler = [] {
  if constexpr (requires { S::needs_distributed_sampler; }) return bool(S::needs_distributed_sampler);
  else return false;
}();

// The device types a strategy runs on (compatibility_rules.hpp reads them).
template <class S>
inline constexpr rules::device_types strategy_devices = [] {
  if constexpr (requires { S::runs_on; }) return rules::device_types(S::runs_on);
  else return rules::device_types::all();
}();

// Whether the strategy scales the loss itself under 16-mixed (ZeRO's
// DeepSpeed loss scaler), so a sharded strategy may take 16-mixed.
template <class S>
inline constexpr bool scales_own_loss = [] {
  if constexpr (requires { S::scales_own_loss; }) return bool(S::scales_own_loss);
  else return false;
}();

// Whether the strategy starts or joins processes: Fabric.launch() calls its
// launch(), and is_forked_child() says whether this process was forked by it.
template <class S>
inline constexpr bool launches_processes = [] {
  if constexpr (requires { S::launches_processes; }) return bool(S::launches_processes);
  else return false;
}();

// Whether the strategy says who a distributed sampler deals batches to
// (sampler_replicas(), sampler_rank()); otherwise the world and the global rank.
template <class S>
inline constexpr bool sets_sampler_ranks = [] {
  if constexpr (requires { S::sets_sampler_ranks; }) return bool(S::sets_sampler_ranks);
  else return false;
}();

// Whether the module and its optimizers must be set up together (ZeRO).
template <class S>
inline constexpr bool needs_joint_setup = [] {
  if constexpr (requires { S::needs_joint_setup; }) return bool(S::needs_joint_setup);
  else return false;
}();

namespace detail {

// Stand-ins the contract calls a strategy's templates with (Boost-style
// archetypes): a precision with exactly the members a strategy may use, and
// the forward a strategy wraps. Declared only: never called.
struct precision_archetype {
  void backward(const at::Tensor& loss);
  void optimizer_step(torch::optim::Optimizer& optimizer, optimizer_slot slot);
  void unscale_gradients(torch::optim::Optimizer& optimizer, optimizer_slot slot);
};
struct forward_archetype {
  at::Tensor operator()() const;
};

// Whether S has a member of this name, of any kind (a template too): the
// name is ambiguous between S and a base that declares it. The optional
// members are opt-in by a flag; a member without its flag (or a flag whose
// member is misspelt) is refused instead of being ignored.
#define LOOM_DETAIL_MEMBER_NAMED(member)                                   \
  struct declares_##member {                                               \
    int member;                                                            \
  };                                                                       \
  template <class S>                                                       \
  struct with_##member : S, declares_##member {};                          \
  template <class S>                                                       \
  concept has_member_##member = !requires { &with_##member<S>::member; };
LOOM_DETAIL_MEMBER_NAMED(launch)
LOOM_DETAIL_MEMBER_NAMED(is_forked_child)
LOOM_DETAIL_MEMBER_NAMED(sampler_rank)
LOOM_DETAIL_MEMBER_NAMED(sampler_replicas)
LOOM_DETAIL_MEMBER_NAMED(forward_replicas)
#undef LOOM_DETAIL_MEMBER_NAMED

namespace strategy_members {
// Layer 1: processes and ranks.
template <class S>
concept name = requires {
  { S::name } -> std::convertible_to<std::string_view>;
};
// Opt-in (launches_processes): both, exactly.
template <class S>
concept launch = requires(S& strategy, const S& constant) {
  strategy.launch();
  { constant.is_forked_child() } -> std::convertible_to<bool>;
};
template <class S>
concept launch_agrees =
    (launches_processes<S> ? launch<S> : !(has_member_launch<S> || has_member_is_forked_child<S>));
// Opt-in (sets_sampler_ranks): both, exactly.
template <class S>
concept sampler_ranks = requires(S& strategy) {
  { strategy.sampler_replicas() } -> std::convertible_to<int>;
  { strategy.sampler_rank() } -> std::convertible_to<int>;
};
template <class S>
concept sampler_ranks_agree =
    (sets_sampler_ranks<S> ? sampler_ranks<S> : !(has_member_sampler_rank<S> || has_member_sampler_replicas<S>));
// Opt-in (replicates_forward): forward_replicas is a template over the
// module and the body, so only its presence is checked here.
template <class S>
concept forward_replicas_agrees = (replicates_forward<S> == has_member_forward_replicas<S>);
template <class S>
concept setup_environment = requires(S& strategy, const strategy_environment& environment) {
  strategy.setup_environment(environment);
};
template <class S>
concept ranks = requires(const S& strategy) {
  { strategy.root_device() } -> std::same_as<c10::Device>;
  { strategy.world_size() } -> std::convertible_to<int>;
  { strategy.global_rank() } -> std::convertible_to<int>;
  { strategy.local_rank() } -> std::convertible_to<int>;
  { strategy.node_rank() } -> std::convertible_to<int>;
};
template <class S>
concept barrier = requires(S& strategy) { strategy.barrier(); };

// Layer 2: module setup and forward.
template <class S>
concept module_state = requires { typename S::module_state; };
template <class S>
concept setup_module = requires(S& strategy, torch::nn::Module& module) {
  { strategy.setup_module(module, true) } -> std::convertible_to<typename S::module_state>;
};
template <class S>
concept joint_setup = requires(S& strategy, torch::nn::Module& module,
                               std::span<torch::optim::Optimizer* const> optimizers) {
  { strategy.setup_module_and_optimizers(module, optimizers, true) } -> std::convertible_to<typename S::module_state>;
};
template <class S>
concept forward = requires(S& strategy, typename S::module_state& state, torch::nn::Module& module,
                           forward_archetype run) {
  { strategy.forward(state, module, run) } -> std::convertible_to<at::Tensor>;
};

// Layer 3: the training step.
template <class S>
concept backward = requires(S& strategy, precision_archetype& precision, const at::Tensor& loss) {
  strategy.backward(precision, loss);
};
template <class S>
concept optimizer_step = requires(S& strategy, precision_archetype& precision, torch::optim::Optimizer& optimizer) {
  strategy.optimizer_step(precision, optimizer, optimizer_slot{});
};
template <class S>
concept zero_grad = requires(S& strategy, torch::optim::Optimizer& optimizer, bool set_to_none) {
  strategy.zero_grad(optimizer, set_to_none);
};
template <class S>
concept clip_gradients = requires(S& strategy, typename S::module_state& state, torch::nn::Module& module,
                                  const clip_options& options) {
  { strategy.clip_gradients(state, module, options) } -> std::same_as<std::optional<double>>;
};
template <class S>
concept no_backward_sync = requires(S& strategy, typename S::module_state& state) {
  strategy.no_backward_sync(state, true);
};

// Layer 4: checkpoints (who writes what, and how it is read back).
template <class S>
concept save_checkpoint = requires(S& strategy, const std::string& path, const state& checkpoint,
                                   const state_filter& filter, const checkpoint_metadata& metadata) {
  strategy.save_checkpoint(path, checkpoint, filter, metadata);
};
template <class S>
concept load_checkpoint = requires(S& strategy, const std::string& path, const state& checkpoint) {
  { strategy.load_checkpoint(path, checkpoint, true) } -> std::same_as<state>;
};

// Layer 5: collectives over the strategy's processes.
template <class S>
concept all_reduce = requires(S& strategy, const at::Tensor& tensor, at::Tensor& in_place) {
  { strategy.all_reduce(tensor, reduce_op::sum) } -> std::convertible_to<at::Tensor>;
  strategy.all_reduce_(in_place, reduce_op::sum);
};
template <class S>
concept all_gather = requires(S& strategy, const at::Tensor& tensor) {
  { strategy.all_gather(tensor, false) } -> std::convertible_to<at::Tensor>;
  { strategy.all_gather_per_rank(tensor) } -> std::convertible_to<std::vector<at::Tensor>>;
};
template <class S>
concept broadcast = requires(S& strategy, const at::Tensor& tensor, const c10::IValue& value) {
  { strategy.broadcast(tensor, 0) } -> std::convertible_to<at::Tensor>;
  { strategy.broadcast_object(value, 0) } -> std::convertible_to<c10::IValue>;
};
template <class S>
concept reduce_scatter = requires(S& strategy, const at::Tensor& tensor) {
  { strategy.reduce_scatter(tensor, reduce_op::sum) } -> std::convertible_to<at::Tensor>;
};
template <class S>
concept reduce_boolean_decision = requires(S& strategy) {
  { strategy.reduce_boolean_decision(true, true) } -> std::same_as<bool>;
};
}  // namespace strategy_members
}  // namespace detail

// ---------------------------------------------------------------------------
// The layers. Each refines the one before it.
// ---------------------------------------------------------------------------
// Processes: a name, the environment read at construction, ranks, a barrier.
template <class S>
concept StrategyProcesses = detail::tagged_as<S, strategy_tag> && detail::strategy_members::name<S> &&
                            detail::strategy_members::setup_environment<S> && detail::strategy_members::ranks<S> &&
                            detail::strategy_members::barrier<S> && detail::strategy_members::launch_agrees<S> &&
                            detail::strategy_members::sampler_ranks_agree<S>;

// Modules: per-module state, setup (alone, or jointly with the optimizers
// where the strategy needs that: then only jointly), and the forward the
// strategy wraps.
template <class S>
concept StrategyModules = StrategyProcesses<S> && detail::strategy_members::module_state<S> &&
                          (needs_joint_setup<S> ? detail::strategy_members::joint_setup<S>
                                                : detail::strategy_members::setup_module<S>) &&
                          detail::strategy_members::forward<S> && detail::strategy_members::forward_replicas_agrees<S>;

// The training step: backward, optimizer step, zero_grad, clip_gradients
// (the norm over the whole model across ranks), and no_backward_sync where
// the strategy says it supports it.
template <class S>
concept StrategyTraining = StrategyModules<S> && detail::strategy_members::backward<S> &&
                           detail::strategy_members::optimizer_step<S> && detail::strategy_members::zero_grad<S> &&
                           detail::strategy_members::clip_gradients<S> &&
                           (!supports_no_backward_sync<S> || detail::strategy_members::no_backward_sync<S>);

// Checkpoints: the strategy decides who writes what (rank zero a full file,
// or every rank its shard) and how a checkpoint is read back.
template <class S>
concept StrategyCheckpoints = StrategyTraining<S> && detail::strategy_members::save_checkpoint<S> &&
                              detail::strategy_members::load_checkpoint<S>;

// Collectives: Lightning's all_reduce, all_gather, broadcast, reduce_scatter,
// broadcast_object and reduce_boolean_decision.
template <class S>
concept StrategyCollectives = StrategyCheckpoints<S> && detail::strategy_members::all_reduce<S> &&
                              detail::strategy_members::all_gather<S> && detail::strategy_members::broadcast<S> &&
                              detail::strategy_members::reduce_scatter<S> &&
                              detail::strategy_members::reduce_boolean_decision<S>;

template <class S>
concept Strategy = StrategyCollectives<S>;

// ---------------------------------------------------------------------------
// Walks the layers in order; the first missing member fails with a sentence.
// ---------------------------------------------------------------------------
template <class S>
constexpr bool diagnose_strategy() {
  namespace m = detail::strategy_members;
  if constexpr (!requires { typename S::loom_concept; }) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: the second argument S is not a strategy: it has no nested loom_concept. "
                  "Use loom::single_device, or add `using loom_concept = loom::strategy_tag;` to your type.");
    return false;
  } else if constexpr (!std::derived_from<typename S::loom_concept, strategy_tag>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: the second argument S is tagged as another kind of policy, not a "
                  "strategy. The order is Fabric<Accelerator, Strategy, Precision>.");
    return false;
  } else if constexpr (!m::name<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `static constexpr std::string_view name`.");
    return false;
    // -- layer 1: processes
  } else if constexpr (!m::setup_environment<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `void setup_environment(const "
                  "loom::strategy_environment&)`; inherit loom::strategy_base for the single-process defaults.");
    return false;
  } else if constexpr (!m::ranks<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs const members root_device(), world_size(), "
                  "global_rank(), local_rank() and node_rank(); inherit loom::strategy_base for the defaults.");
    return false;
  } else if constexpr (!m::barrier<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `void barrier()`; inherit loom::strategy_base for the "
                  "single-process default (nothing to wait for).");
    return false;
  } else if constexpr (launches_processes<S> && !m::launch<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S says launches_processes, so it needs `void launch()` and `bool "
                  "is_forked_child() const`; inherit loom::parallel for them.");
    return false;
  } else if constexpr (!m::launch_agrees<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S has launch() or is_forked_child() but does not say "
                  "`static constexpr bool launches_processes = true;`, so Fabric would never call them.");
    return false;
  } else if constexpr (sets_sampler_ranks<S> && !m::sampler_ranks<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S says sets_sampler_ranks, so it needs `int sampler_replicas()` "
                  "and `int sampler_rank()` (who a distributed sampler deals batches to).");
    return false;
  } else if constexpr (!m::sampler_ranks_agree<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S has sampler_replicas() or sampler_rank() but does not say "
                  "`static constexpr bool sets_sampler_ranks = true;`, so samplers would deal over the world.");
    return false;
    // -- layer 2: modules
  } else if constexpr (!m::module_state<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `using module_state = ...` (what it keeps per set-up "
                  "module; an empty struct when nothing); inherit loom::strategy_base for the default.");
    return false;
  } else if constexpr (!needs_joint_setup<S> && !m::setup_module<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `module_state setup_module(torch::nn::Module&, bool "
                  "move_to_device)`; inherit loom::strategy_base for the default (move to the root device).");
    return false;
  } else if constexpr (needs_joint_setup<S> && !m::joint_setup<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S says needs_joint_setup, so it needs `module_state "
                  "setup_module_and_optimizers(torch::nn::Module&, std::span<torch::optim::Optimizer* const>, bool "
                  "move_to_device)`.");
    return false;
  } else if constexpr (!m::forward<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `template <class F> decltype(auto) "
                  "forward(module_state&, torch::nn::Module&, F&& run)` returning run()'s result; inherit "
                  "loom::strategy_base for the default (just run it).");
    return false;
  } else if constexpr (!m::forward_replicas_agrees<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S's forward_replicas and its flag disagree: say `static "
                  "constexpr bool replicates_forward = true;` together with `forward_replicas(module_state&, Impl&, "
                  "Body&&, const Args&...)`, or neither.");
    return false;
    // -- layer 3: the training step
  } else if constexpr (!m::backward<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `template <class P> void backward(P& precision, const "
                  "at::Tensor& loss)`; inherit loom::strategy_base for the default (precision.backward(loss)).");
    return false;
  } else if constexpr (!m::optimizer_step<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `template <class P> void optimizer_step(P& precision, "
                  "torch::optim::Optimizer&, loom::optimizer_slot)`; inherit loom::strategy_base for the default "
                  "(precision.optimizer_step).");
    return false;
  } else if constexpr (!m::zero_grad<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `void zero_grad(torch::optim::Optimizer&, bool set_to_none)`; "
                  "inherit loom::strategy_base for the default (the optimizer's own zero_grad).");
    return false;
  } else if constexpr (!m::clip_gradients<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `std::optional<double> clip_gradients(module_state&, "
                  "torch::nn::Module&, const loom::clip_options&)` returning the norm over the whole model across "
                  "ranks; inherit loom::strategy_base for the default (a local norm, right when gradients are "
                  "replicated).");
    return false;
  } else if constexpr (supports_no_backward_sync<S> && !m::no_backward_sync<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S says supports_no_backward_sync, so it needs "
                  "`no_backward_sync(module_state&, bool enabled)` returning a guard.");
    return false;
    // -- layer 4: checkpoints
  } else if constexpr (!m::save_checkpoint<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `void save_checkpoint(const std::string& path, const "
                  "loom::state&, const loom::state_filter&, const loom::checkpoint_metadata&)`; inherit "
                  "loom::strategy_base for the default (one file, written by global rank zero).");
    return false;
  } else if constexpr (!m::load_checkpoint<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `loom::state load_checkpoint(const std::string& path, "
                  "const loom::state&, bool strict)`; inherit loom::strategy_base for the default.");
    return false;
    // -- layer 5: collectives
  } else if constexpr (!m::all_reduce<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs all_reduce(const at::Tensor&, loom::reduce_op) -> "
                  "at::Tensor and all_reduce_(at::Tensor&, loom::reduce_op); inherit loom::strategy_base for the "
                  "one-process identities.");
    return false;
  } else if constexpr (!m::all_gather<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs all_gather(const at::Tensor&, bool sync_grads) -> "
                  "at::Tensor (stacked) and all_gather_per_rank(const at::Tensor&) -> std::vector<at::Tensor>; "
                  "inherit loom::strategy_base for the one-process identities.");
    return false;
  } else if constexpr (!m::broadcast<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs broadcast(const at::Tensor&, int source) -> at::Tensor "
                  "and broadcast_object(const c10::IValue&, int source) -> c10::IValue; inherit loom::strategy_base "
                  "for the one-process identities.");
    return false;
  } else if constexpr (!m::reduce_scatter<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs reduce_scatter(const at::Tensor&, loom::reduce_op) -> "
                  "at::Tensor; inherit loom::strategy_base for the one-process identity.");
    return false;
  } else if constexpr (!m::reduce_boolean_decision<S>) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `bool reduce_boolean_decision(bool decision, bool all)`; "
                  "inherit loom::strategy_base for the one-process identity.");
    return false;
  } else {
    return true;
  }
}

}  // namespace loom
