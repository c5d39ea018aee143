// What every policy contract shares: the opt-in tags, the optimizer slot, and
// the helpers behind the diagnose_* chains.
#pragma once

#include <concepts>

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

}  // namespace loom
