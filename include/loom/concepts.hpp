// The contracts of loom's three policies (Accelerator, Strategy, Precision),
// their capability traits, and the diagnose_* chains behind Fabric's errors.
#pragma once

#include <loom/concepts/base.hpp>
#include <loom/concepts/strategy.hpp>
#include <loom/devices.hpp>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <concepts>
#include <string_view>
#include <type_traits>

namespace loom {

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
  { P::converts_io } -> std::convertible_to<bool>;
  const_precision.forward_context(c10::DeviceType::CPU);
  const_precision.init_context();
  precision.backward(tensor);
  precision.optimizer_step(optimizer, optimizer_slot{});
  precision.unscale_gradients(optimizer, optimizer_slot{});
};

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
  } else if constexpr (!requires { { P::converts_io } -> std::convertible_to<bool>; }) {
    static_assert(detail::dependent_false<P>,
                  "loom::Fabric<A, S, P>: precision P needs `static constexpr bool converts_io` (whether forward's "
                  "inputs and outputs are converted; false lets loom skip them at compile time); inherit "
                  "loom::precision_base for the default (false).");
    return false;
  } else if constexpr (!requires(const P& precision) { precision.init_context(); }) {
    static_assert(detail::dependent_false<P>,
                  "loom::Fabric<A, S, P>: precision P needs `init_context() const` returning a guard under which "
                  "new tensors get its dtype (fabric.init_module); inherit loom::precision_base for the default.");
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
