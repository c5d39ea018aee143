// The module class a type names: torch::nn::LinearImpl for the holder
// torch::nn::Linear and for LinearImpl itself. What lets loom::unit<M> and
// auto_wrap_policy::types<M...>() take either spelling. No torch headers.
#pragma once

namespace loom {

namespace detail {
template <class M>
struct held_module {
  using type = M;
};
template <class M>
  requires requires { typename M::ContainedType; }
struct held_module<M> {
  using type = typename M::ContainedType;
};
}  // namespace detail

template <class M>
using held_module_t = typename detail::held_module<M>::type;

}  // namespace loom
