// The guard an erased Fabric returns for autocast(), init_module() and
// no_backward_sync(): the combination's own guard, built in place in a small
// inline buffer (no heap allocation) and destroyed with it.
#pragma once

#include <cstddef>
#include <new>
#include <type_traits>
#include <utility>

namespace loom {

class [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] any_guard {
 public:
  static constexpr std::size_t capacity = 64;

  any_guard() = default;
  // Built by fill(*this), which emplaces the real guard: returned as a
  // prvalue, the guard is never moved (guards are not movable).
  template <class Fill>
    requires std::is_invocable_v<Fill&, any_guard&>
  explicit any_guard(Fill&& fill) {
    fill(*this);
  }
  any_guard(const any_guard&) = delete;
  any_guard& operator=(const any_guard&) = delete;
  ~any_guard() {
    if (destroy_ != nullptr) destroy_(storage_);
  }

  // Constructs the guard make() returns in the buffer (guaranteed elision).
  template <class Make>
  void emplace_from(Make&& make) {
    using guard = decltype(make());
    static_assert(sizeof(guard) <= capacity && alignof(guard) <= alignof(std::max_align_t),
                  "loom::any_guard: this guard is larger than any_guard's inline buffer; raise capacity.");
    if constexpr (!std::is_empty_v<guard> || !std::is_trivially_destructible_v<guard>) {
      ::new (static_cast<void*>(storage_)) guard(std::forward<Make>(make)());
      destroy_ = [](void* object) { static_cast<guard*>(object)->~guard(); };
    } else {
      (void)std::forward<Make>(make)();
    }
  }
  bool holds_guard() const noexcept { return destroy_ != nullptr; }

 private:
  alignas(std::max_align_t) unsigned char storage_[capacity];
  void (*destroy_)(void*) = nullptr;
};

}  // namespace loom
