// ModuleHolder: what loom accepts as a module (a TORCH_MODULE holder or a
// shared_ptr to a torch::nn::Module subclass), and the module class behind it.
#pragma once

#include <loom/util/module_fwd.hpp>

#include <concepts>
#include <memory>
#include <type_traits>

namespace loom {

namespace detail {
// The module class behind a holder: TORCH_MODULE holders and shared_ptrs.
template <class Holder>
struct module_impl {};
template <class Impl>
struct module_impl<std::shared_ptr<Impl>> {
  using type = Impl;
};
template <class Holder>
  requires std::derived_from<Holder, torch::nn::ModuleHolder<typename Holder::ContainedType>>
struct module_impl<Holder> {
  using type = typename Holder::ContainedType;
};
}  // namespace detail

template <class Holder>
concept ModuleHolder = requires { typename detail::module_impl<std::remove_cvref_t<Holder>>::type; } &&
                       std::derived_from<typename detail::module_impl<std::remove_cvref_t<Holder>>::type,
                                         torch::nn::Module>;

template <class Holder>
using module_impl_t = typename detail::module_impl<std::remove_cvref_t<Holder>>::type;

}  // namespace loom
