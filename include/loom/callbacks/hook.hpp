// Hooks are tag types: a name and the arguments a callback receives. Declare
// your own with LOOM_DECLARE_HOOK(name, argument types...); a callback opts in
// by having a member function of that name.
#pragma once

#include <atomic>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

namespace loom {

struct hook_tag {};

namespace detail {
inline int next_hook_id() {
  static std::atomic<int> counter{0};
  return counter.fetch_add(1);
}
}  // namespace detail

// A dense id per hook type, so dispatch is an index, not a name lookup.
template <class Hook>
int hook_id() {
  static const int id = detail::next_hook_id();
  return id;
}

template <class Hook>
concept HookType = std::same_as<typename Hook::loom_concept, hook_tag>;

template <class... Args>
struct hook_arguments {
  // Declared argument types as given (const T& for objects, values for numbers).
  using tuple = std::tuple<Args...>;
};

}  // namespace loom

// Declares hook `hook_name` whose callbacks are called as cb.hook_name(args...).
// The type lives in the current namespace; use it as fabric.call<hook_name>(...).
#define LOOM_DECLARE_HOOK(hook_name, ...)                                                               \
  struct hook_name {                                                                                    \
    using loom_concept = ::loom::hook_tag;                                                              \
    using arguments = typename ::loom::hook_arguments<__VA_ARGS__>::tuple;                              \
    static constexpr std::string_view name = #hook_name;                                                \
    /* Whether C has a member of this name at all (to tell a wrong signature from no hook). */          \
    template <class C>                                                                                  \
    static constexpr bool named_by = requires { &C::hook_name; };                                       \
    template <class C>                                                                                  \
    static constexpr bool implemented_by = []<class... A>(std::tuple<A...>*) {                          \
      return requires(C& callback, A&... args) { callback.hook_name(args...); };                         \
    }(static_cast<arguments*>(nullptr));                                                                \
    template <class C>                                                                                  \
    static void invoke(void* callback, arguments& args) {                                               \
      [&]<std::size_t... I>(std::index_sequence<I...>) {                                                \
        /* lvalues: every callback of the hook sees the same, unmoved arguments */                     \
        static_cast<C*>(callback)->hook_name(std::get<I>(args)...);                                     \
      }(std::make_index_sequence<std::tuple_size_v<arguments>>{});                                      \
    }                                                                                                   \
  }
