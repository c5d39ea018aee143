// loom::precision_dtypes: what a strategy and its engines know of the
// Fabric's precision (concepts/strategy.hpp hands it over in
// strategy_environment).
#pragma once

#include <c10/core/ScalarType.h>

#include <string_view>

namespace loom {

// The Fabric's precision as a strategy and its engines need it: typed facts
// read off the precision policy (precision_dtypes_of<P>), never compared by
// name; the name is carried for messages only.
struct precision_dtypes {
  std::string_view name = "32-true";
  c10::ScalarType param_dtype = c10::ScalarType::Float;    // the parameters' dtype once converted
  c10::ScalarType compute_dtype = c10::ScalarType::Float;  // the forward's (autocast's, when mixed)
  bool mixed = false;                                      // autocast over parameters kept in param_dtype

  // fp16 and bf16 compute, mixed or true (what DeepSpeed's fp16 and bf16 sections stand for).
  bool half() const noexcept { return compute_dtype == c10::ScalarType::Half; }
  bool bfloat() const noexcept { return compute_dtype == c10::ScalarType::BFloat16; }
};

template <class P>
constexpr precision_dtypes precision_dtypes_of() {
  precision_dtypes facts{.name = P::name};
  if constexpr (requires { P::param_dtype; }) facts.param_dtype = P::param_dtype;
  if constexpr (requires { P::compute_dtype; }) facts.compute_dtype = P::compute_dtype;
  if constexpr (requires { P::is_mixed; }) facts.mixed = P::is_mixed;
  return facts;
}

}  // namespace loom
