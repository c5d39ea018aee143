// Which Accelerator x Strategy x Precision combinations can run: the rules of
// concepts/compatibility_rules.hpp over the facts the types state. Fabric
// asserts each rule with its sentence; the run-time registry filters its
// product with compatible<A, S, P>; the connector asks the same rules by name.
#pragma once

#include <loom/concepts.hpp>
#include <loom/concepts/compatibility_rules.hpp>

namespace loom {

// The rules' device type of an accelerator's c10::DeviceType.
template <class A>
constexpr rules::device_type device_type_of() {
  static_assert(A::device_type == c10::DeviceType::CPU || A::device_type == c10::DeviceType::CUDA,
                "loom: this accelerator's device_type is neither CPU nor CUDA; add it to loom::rules::device_type "
                "(concepts/compatibility_rules.hpp) and to device_type_of (compatibility.hpp)");
  return A::device_type == c10::DeviceType::CUDA ? rules::device_type::cuda : rules::device_type::cpu;
}

template <class A>
constexpr rules::accelerator_facts accelerator_facts_of() {
  return {.name = A::name, .device = device_type_of<A>(), .fp16_compute = supports_fp16_compute<A>};
}
template <class P>
constexpr rules::precision_facts precision_facts_of() {
  return {.name = P::name,
          .fp16 = P::compute_dtype == c10::ScalarType::Half,
          .mixed = bool(P::is_mixed),
          .fp64 = P::compute_dtype == c10::ScalarType::Double};
}
template <class S>
constexpr rules::strategy_facts strategy_facts_of() {
  return {.name = S::name,
          .multi_process = is_distributed<S>,
          .devices = strategy_devices<S>,
          .sharded = is_sharded<S>,
          .scales_own_loss = scales_own_loss<S>};
}

template <class A, class S, class P>
inline constexpr rules::rule broken_rule =
    rules::first_broken(accelerator_facts_of<A>(), strategy_facts_of<S>(), precision_facts_of<P>());

template <class A, class S, class P>
inline constexpr bool compatible = broken_rule<A, S, P> == rules::rule::none;

// Fails, with the rule's sentence, when the combination cannot run.
template <class A, class S, class P>
constexpr bool diagnose_combination() {
  constexpr rules::rule broken = broken_rule<A, S, P>;
  static_assert(broken != rules::rule::strategy_not_on_accelerator,
                "loom::Fabric<A, S, P>: " LOOM_RULE_STRATEGY_NOT_ON_ACCELERATOR);
  static_assert(broken != rules::rule::dp_on_cpu, "loom::Fabric<A, S, P>: " LOOM_RULE_DP_ON_CPU);
  static_assert(broken != rules::rule::sharded_precision, "loom::Fabric<A, S, P>: " LOOM_RULE_SHARDED_PRECISION);
  static_assert(broken != rules::rule::fp16_true_without_kernels,
                "loom::Fabric<A, S, P>: " LOOM_RULE_FP16_TRUE_WITHOUT_KERNELS);
  static_assert(broken != rules::rule::fp16_autocast_without_kernels,
                "loom::Fabric<A, S, P>: " LOOM_RULE_FP16_AUTOCAST_WITHOUT_KERNELS);
  return broken == rules::rule::none;
}

}  // namespace loom
