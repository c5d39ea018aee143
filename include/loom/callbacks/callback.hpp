// A callback of any type, registered once: at construction loom finds, at
// compile time, which hooks the type implements and keeps one thunk for each.
// call<Hook>(args...) then runs exactly those, in registration order.
// Callbacks are off the hot path, so type erasure is fine here.
#pragma once

#include <loom/callbacks/hooks.hpp>

#include <functional>
#include <memory>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

namespace detail {
template <class T>
struct unwrap_reference {
  using type = T;
};
template <class T>
struct unwrap_reference<std::reference_wrapper<T>> {
  using type = T;
};

// The hooks a callback declares beyond the built-in ones (`using loom_hooks = std::tuple<...>;`).
template <class C>
struct own_hooks {
  using type = std::tuple<>;
};
template <class C>
  requires requires { typename C::loom_hooks; }
struct own_hooks<C> {
  using type = typename C::loom_hooks;
};
template <class C>
using own_hooks_t = typename own_hooks<C>::type;

// Whether C's loom_hooks lists a hook of this name.
template <class C>
constexpr bool lists_hook_named(std::string_view name) {
  return [name]<class... Hooks>(std::tuple<Hooks...>*) {
    return ((Hooks::name == name) || ...);
  }(static_cast<own_hooks_t<C>*>(nullptr));
}
}  // namespace detail

class callback {
 public:
  using thunk = void (*)(void* object, void* arguments);
  struct hook_entry {
    int hook;
    thunk invoke;
  };

  // By value (loom keeps the copy), by shared_ptr, or by std::ref (the caller keeps it alive).
  template <class C>
    requires(!std::is_same_v<std::remove_cvref_t<C>, callback>)
  callback(C&& object) {  // NOLINT: implicit, so `.callbacks = {a, b}` reads naturally
    using stored = std::remove_cvref_t<C>;
    if constexpr (requires { typename stored::element_type; object.get(); }) {
      using target = typename stored::element_type;
      object_ = std::shared_ptr<void>(object, object.get());
      bind<target>();
    } else if constexpr (!std::is_same_v<typename detail::unwrap_reference<stored>::type, stored>) {
      using target = typename detail::unwrap_reference<stored>::type;
      object_ = std::shared_ptr<void>(&object.get(), [](void*) {});
      bind<target>();
    } else {
      object_ = std::make_shared<stored>(std::forward<C>(object));
      bind<stored>();
    }
  }

  const std::vector<hook_entry>& hooks() const noexcept { return hooks_; }
  void* object() const noexcept { return object_.get(); }
  // The registered object, when it is a T (nullptr otherwise).
  template <class T>
  T* get() const noexcept {
    return type_ == &typeid(T) ? static_cast<T*>(object_.get()) : nullptr;
  }

 private:
  template <class C>
  void bind() {
    // The trainer's hooks take its own types, so they are declared above
    // this layer and bound only when listed; a member of their name that is
    // not listed would silently never be called.
    static_assert(!requires { &C::on_fit_start; } || detail::lists_hook_named<C>("on_fit_start"),
                  "loom::callback: your callback has on_fit_start, a hook of loom's trainer; list the trainer's "
                  "hooks in it: using loom_hooks = loom::trainer_hooks; (from <loom/trainer/hooks.hpp>).");
    type_ = &typeid(C);
    bind_list<C>(static_cast<builtin_hooks*>(nullptr));
    bind_list<C>(static_cast<detail::own_hooks_t<C>*>(nullptr));
  }

  template <class C, class... Hooks>
  void bind_list(std::tuple<Hooks...>*) {
    (bind_one<C, Hooks>(), ...);
  }

  template <class C, class Hook>
  void bind_one() {
    static_assert(HookType<Hook>,
                  "loom::callback: an entry of your callback's loom_hooks is not a hook; declare it with "
                  "LOOM_DECLARE_HOOK(name, argument types...).");
    if constexpr (Hook::template implemented_by<C>) {
      hooks_.push_back({hook_id<Hook>(), [](void* object, void* arguments) {
                          Hook::template invoke<C>(object, *static_cast<typename Hook::arguments*>(arguments));
                        }});
    } else if constexpr (Hook::template named_by<C>) {
      static_assert(Hook::template implemented_by<C>,
                    "loom::callback: your callback has a member function named like a hook (see Hook in the "
                    "instantiation context), but it cannot be called with that hook's arguments. Give it the "
                    "parameters the hook declares, e.g. on_train_batch_end(const at::Tensor& loss, "
                    "std::int64_t batch_idx).");
    }
  }

  std::shared_ptr<void> object_;
  const std::type_info* type_ = nullptr;
  std::vector<hook_entry> hooks_;
};

// The callbacks of one Fabric, indexed by hook id.
class callback_registry {
 public:
  void add(callback entry) {
    for (const auto& hook : entry.hooks()) {
      if (hook.hook >= static_cast<int>(by_hook_.size())) by_hook_.resize(static_cast<std::size_t>(hook.hook) + 1);
      by_hook_[static_cast<std::size_t>(hook.hook)].push_back({entry.object(), hook.invoke});
    }
    callbacks_.push_back(std::move(entry));
  }

  template <class Hook, class... Given>
  void call(Given&&... given) {
    static_assert(HookType<Hook>,
                  "loom::Fabric::call<Hook>: Hook is not a hook; declare it with LOOM_DECLARE_HOOK(name, "
                  "argument types...).");
    static_assert(std::is_constructible_v<typename Hook::arguments, Given&&...>,
                  "loom::Fabric::call<Hook>(args...): the arguments do not match the ones the hook declares.");
    const auto id = static_cast<std::size_t>(hook_id<Hook>());
    if (id >= by_hook_.size() || by_hook_[id].empty()) return;
    typename Hook::arguments arguments(std::forward<Given>(given)...);
    for (const auto& target : by_hook_[id]) target.invoke(target.object, &arguments);
  }

  const std::vector<callback>& callbacks() const noexcept { return callbacks_; }

 private:
  struct target {
    void* object;
    callback::thunk invoke;
  };
  std::vector<std::vector<target>> by_hook_;
  std::vector<callback> callbacks_;
};

}  // namespace loom
