// Which Accelerator x Strategy x Precision combinations can run, stated once:
// Fabric asserts each rule with its own sentence, and the run-time registry
// filters its product with the same predicate.
#pragma once

#include <loom/concepts.hpp>

namespace loom {

namespace rules {
// fp16 matmul (16-true) on an accelerator without fp16 kernels.
template <class A, class P>
inline constexpr bool fp16_true_without_kernels =
    P::compute_dtype == c10::ScalarType::Half && !P::is_mixed && !supports_fp16_compute<A>;
// fp16 autocast (16-mixed) on an accelerator that refuses it.
template <class A, class P>
inline constexpr bool fp16_autocast_without_kernels =
    P::compute_dtype == c10::ScalarType::Half && P::is_mixed && !supports_fp16_compute<A>;
}  // namespace rules

template <class A, class S, class P>
inline constexpr bool compatible =
    !rules::fp16_true_without_kernels<A, P> && !rules::fp16_autocast_without_kernels<A, P>;

// Fails, with a sentence per rule, when the combination cannot run.
template <class A, class S, class P>
constexpr bool diagnose_combination() {
  static_assert(!rules::fp16_true_without_kernels<A, P>,
                "loom::Fabric<loom::cpu, S, loom::fp16>: LibTorch 1.13 has no fp16 matmul kernels on CPU, so "
                "16-true cannot run there. Use loom::bf16 (bf16-true) on cpu, or loom::cuda for fp16.");
  static_assert(!rules::fp16_autocast_without_kernels<A, P>,
                "loom::Fabric<loom::cpu, S, loom::fp16_mixed>: LibTorch 1.13 refuses fp16 autocast on CPU, so "
                "16-mixed cannot run there. Use loom::bf16_mixed (bf16-mixed) on cpu, or loom::cuda for 16-mixed.");
  return compatible<A, S, P>;
}

}  // namespace loom
