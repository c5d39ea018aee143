// The contracts of loom's three policies (Accelerator, Strategy, Precision),
// their capability traits, and the diagnose_* chains behind Fabric's errors.
#pragma once

#include <loom/devices.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <concepts>
#include <string_view>
#include <type_traits>

namespace torch::nn {
class Module;
}
namespace torch::optim {
class Optimizer;
}

namespace loom {

// Opt-in tags: a policy names its kind with `using loom_concept = loom::..._tag;`.
struct accelerator_tag {};
struct strategy_tag {};
struct precision_tag {};

// Which optimizer a precision or strategy is asked to step: setup_optimizers
// hands out one slot per optimizer, so per-optimizer state needs no lookup.
struct optimizer_slot {
  int index = 0;
};

namespace detail {
template <class T>
inline constexpr bool dependent_false = false;

template <class T, class Tag>
concept tagged_as = requires { typename T::loom_concept; } && std::derived_from<typename T::loom_concept, Tag>;
}  // namespace detail

// ---------------------------------------------------------------------------
// Accelerator: where tensors live. Static members only; no state.
// ---------------------------------------------------------------------------
template <class A>
concept Accelerator = detail::tagged_as<A, accelerator_tag> && requires(const devices_spec& devices,
                                                                         const device_selection& selection) {
  { A::name } -> std::convertible_to<std::string_view>;
  { A::device_type } -> std::convertible_to<c10::DeviceType>;
  { A::is_available() } -> std::same_as<bool>;
  { A::device_count() } -> std::convertible_to<int>;
  { A::parse_devices(devices) } -> std::same_as<device_selection>;
  { A::device(selection, 0) } -> std::same_as<c10::Device>;
};

// ---------------------------------------------------------------------------
// Precision: dtypes of weights, inputs and outputs, the forward context, and
// how backward and the optimizer step are scaled.
// ---------------------------------------------------------------------------
template <class P>
concept Precision = detail::tagged_as<P, precision_tag> &&
    requires(P& precision, const P& const_precision, torch::nn::Module& module, const at::Tensor& tensor,
             torch::optim::Optimizer& optimizer) {
  { P::name } -> std::convertible_to<std::string_view>;
  { P::param_dtype } -> std::convertible_to<c10::ScalarType>;
  { P::compute_dtype } -> std::convertible_to<c10::ScalarType>;
  { P::is_mixed } -> std::convertible_to<bool>;
  precision.convert_module(module);
  { const_precision.convert_input(tensor) } -> std::same_as<at::Tensor>;
  { const_precision.convert_output(tensor) } -> std::same_as<at::Tensor>;
  const_precision.forward_context(c10::DeviceType::CPU);
  precision.backward(tensor);
  precision.optimizer_step(optimizer, optimizer_slot{});
  precision.unscale_gradients(optimizer, optimizer_slot{});
};

// ---------------------------------------------------------------------------
// Strategy: processes, devices, how the module is wrapped and gradients are
// synchronised. It is a stateful object held by Fabric.
// ---------------------------------------------------------------------------
// What Fabric hands its strategy: the devices as the user asked for them and
// the accelerator's functions to resolve them (the strategy knows its local
// rank, and so which device is its own, only after reading its environment).
struct strategy_environment {
  devices_spec requested;
  device_selection (*parse_devices)(const devices_spec&) = nullptr;
  c10::Device (*device_of)(const device_selection&, int local_rank) = nullptr;
  std::string_view accelerator;
  std::string_view strategy;
  int num_nodes = 1;
};

template <class S>
concept Strategy = detail::tagged_as<S, strategy_tag> &&
    requires(S& strategy, const S& const_strategy, const strategy_environment& environment,
             torch::nn::Module& module) {
  { S::name } -> std::convertible_to<std::string_view>;
  typename S::module_state;
  strategy.setup_environment(environment);
  { const_strategy.root_device() } -> std::same_as<c10::Device>;
  { const_strategy.world_size() } -> std::convertible_to<int>;
  { const_strategy.global_rank() } -> std::convertible_to<int>;
  { const_strategy.local_rank() } -> std::convertible_to<int>;
  { const_strategy.node_rank() } -> std::convertible_to<int>;
  { strategy.setup_module(module) } -> std::convertible_to<typename S::module_state>;
  strategy.barrier();
};

// ---------------------------------------------------------------------------
// Capability traits. A strategy states them as static constexpr members; the
// traits read them with safe defaults so a minimal user strategy still works.
// ---------------------------------------------------------------------------
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

// Whether the module and its optimizers must be set up together (ZeRO).
template <class S>
inline constexpr bool needs_joint_setup = [] {
  if constexpr (requires { S::needs_joint_setup; }) return bool(S::needs_joint_setup);
  else return false;
}();

// Whether fp16 compute (true fp16 matmul, fp16 autocast) runs on accelerator A.
template <class A>
inline constexpr bool supports_fp16_compute = [] {
  if constexpr (requires { A::supports_fp16_compute; }) return bool(A::supports_fp16_compute);
  else return true;
}();

template <class P>
inline constexpr bool has_precision_state = [] {
  if constexpr (requires { P::has_state; }) return bool(P::has_state);
  else return false;
}();

// ---------------------------------------------------------------------------
// Diagnostics: walk each contract in order and stop at the first missing piece
// with a sentence that says how to fix it. Each returns true when all is well,
// so Fabric can write static_assert(diagnose_accelerator<A>()).
// ---------------------------------------------------------------------------
template <class A>
constexpr bool diagnose_accelerator() {
  if constexpr (!requires { typename A::loom_concept; }) {
    static_assert(detail::dependent_false<A>,
                  "loom::Fabric<A, S, P>: the first argument A is not an accelerator: it has no nested loom_concept. "
                  "Use loom::cpu or loom::cuda, or add `using loom_concept = loom::accelerator_tag;` to your type.");
    return false;
  } else if constexpr (!std::derived_from<typename A::loom_concept, accelerator_tag>) {
    static_assert(detail::dependent_false<A>,
                  "loom::Fabric<A, S, P>: the first argument A is tagged as another kind of policy, not an "
                  "accelerator. The order is Fabric<Accelerator, Strategy, Precision>, e.g. "
                  "Fabric<loom::cpu, loom::single_device, loom::fp32>.");
    return false;
  } else if constexpr (!requires { { A::name } -> std::convertible_to<std::string_view>; }) {
    static_assert(detail::dependent_false<A>,
                  "loom::Fabric<A, S, P>: accelerator A needs `static constexpr std::string_view name` (e.g. \"cpu\").");
    return false;
  } else if constexpr (!requires { { A::device_type } -> std::convertible_to<c10::DeviceType>; }) {
    static_assert(detail::dependent_false<A>,
                  "loom::Fabric<A, S, P>: accelerator A needs `static constexpr c10::DeviceType device_type`.");
    return false;
  } else if constexpr (!requires {
                         { A::is_available() } -> std::same_as<bool>;
                         { A::device_count() } -> std::convertible_to<int>;
                       }) {
    static_assert(detail::dependent_false<A>,
                  "loom::Fabric<A, S, P>: accelerator A needs `static bool is_available()` and "
                  "`static int device_count()`.");
    return false;
  } else if constexpr (!requires(const devices_spec& devices, const device_selection& selection) {
                         { A::parse_devices(devices) } -> std::same_as<device_selection>;
                         { A::device(selection, 0) } -> std::same_as<c10::Device>;
                       }) {
    static_assert(detail::dependent_false<A>,
                  "loom::Fabric<A, S, P>: accelerator A needs `static loom::device_selection "
                  "parse_devices(const loom::devices_spec&)` and `static c10::Device device(const "
                  "loom::device_selection&, int local_rank)`.");
    return false;
  } else {
    return true;
  }
}

template <class S>
constexpr bool diagnose_strategy() {
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
  } else if constexpr (!requires { { S::name } -> std::convertible_to<std::string_view>; }) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `static constexpr std::string_view name`.");
    return false;
  } else if constexpr (!requires(S& strategy, const strategy_environment& environment) {
                         strategy.setup_environment(environment);
                       }) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `void setup_environment(const "
                  "loom::strategy_environment&)`; inherit loom::strategy_base for the single-process defaults.");
    return false;
  } else if constexpr (!requires(const S& strategy) {
                         { strategy.root_device() } -> std::same_as<c10::Device>;
                         { strategy.world_size() } -> std::convertible_to<int>;
                         { strategy.global_rank() } -> std::convertible_to<int>;
                         { strategy.local_rank() } -> std::convertible_to<int>;
                         { strategy.node_rank() } -> std::convertible_to<int>;
                       }) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs const members root_device(), world_size(), "
                  "global_rank(), local_rank() and node_rank(); inherit loom::strategy_base for the defaults.");
    return false;
  } else if constexpr (!requires(S& strategy, torch::nn::Module& module) {
                         typename S::module_state;
                         { strategy.setup_module(module) } -> std::convertible_to<typename S::module_state>;
                         strategy.barrier();
                       }) {
    static_assert(detail::dependent_false<S>,
                  "loom::Fabric<A, S, P>: strategy S needs `using module_state = ...`, `module_state "
                  "setup_module(torch::nn::Module&, bool move_to_device = true)` and `void barrier()`; inherit "
                  "loom::strategy_base for the defaults.");
    return false;
  } else {
    return true;
  }
}

template <class P>
constexpr bool diagnose_precision() {
  if constexpr (!requires { typename P::loom_concept; }) {
    static_assert(detail::dependent_false<P>,
                  "loom::Fabric<A, S, P>: the third argument P is not a precision: it has no nested loom_concept. "
                  "Use loom::fp32, loom::fp64, loom::bf16, loom::bf16_mixed, loom::fp16 or loom::fp16_mixed, or "
                  "add `using loom_concept = loom::precision_tag;` to your type.");
    return false;
  } else if constexpr (!std::derived_from<typename P::loom_concept, precision_tag>) {
    static_assert(detail::dependent_false<P>,
                  "loom::Fabric<A, S, P>: the third argument P is tagged as another kind of policy, not a "
                  "precision. The order is Fabric<Accelerator, Strategy, Precision>.");
    return false;
  } else if constexpr (!requires { { P::name } -> std::convertible_to<std::string_view>; }) {
    static_assert(detail::dependent_false<P>,
                  "loom::Fabric<A, S, P>: precision P needs `static constexpr std::string_view name` "
                  "(Lightning's string, e.g. \"32-true\").");
    return false;
  } else if constexpr (!requires {
                         { P::param_dtype } -> std::convertible_to<c10::ScalarType>;
                         { P::compute_dtype } -> std::convertible_to<c10::ScalarType>;
                         { P::is_mixed } -> std::convertible_to<bool>;
                       }) {
    static_assert(detail::dependent_false<P>,
                  "loom::Fabric<A, S, P>: precision P needs `static constexpr c10::ScalarType param_dtype`, "
                  "`compute_dtype` and `static constexpr bool is_mixed`.");
    return false;
  } else if constexpr (!requires(P& precision, const P& const_precision, torch::nn::Module& module,
                                 const at::Tensor& tensor) {
                         precision.convert_module(module);
                         { const_precision.convert_input(tensor) } -> std::same_as<at::Tensor>;
                         { const_precision.convert_output(tensor) } -> std::same_as<at::Tensor>;
                         const_precision.forward_context(c10::DeviceType::CPU);
                       }) {
    static_assert(detail::dependent_false<P>,
                  "loom::Fabric<A, S, P>: precision P needs convert_module(torch::nn::Module&), "
                  "convert_input/convert_output(const at::Tensor&) -> at::Tensor and "
                  "forward_context(c10::DeviceType) returning a guard; inherit loom::precision_base for the "
                  "identity defaults.");
    return false;
  } else if constexpr (!requires(P& precision, const at::Tensor& tensor, torch::optim::Optimizer& optimizer) {
                         precision.backward(tensor);
                         precision.optimizer_step(optimizer, optimizer_slot{});
                         precision.unscale_gradients(optimizer, optimizer_slot{});
                       }) {
    static_assert(detail::dependent_false<P>,
                  "loom::Fabric<A, S, P>: precision P needs backward(const at::Tensor&), "
                  "optimizer_step(torch::optim::Optimizer&, loom::optimizer_slot) and "
                  "unscale_gradients(torch::optim::Optimizer&, loom::optimizer_slot); inherit "
                  "loom::precision_base for the defaults.");
    return false;
  } else {
    return true;
  }
}

}  // namespace loom
