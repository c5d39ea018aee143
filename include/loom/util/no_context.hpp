// The guard of a policy that needs no context (a precision without autocast,
// a strategy with nothing to skip).
#pragma once

namespace loom {

// Empty, so the compiler removes it; the user-provided destructor only keeps
// compilers from warning that `auto guard = fabric.autocast();` is unused.
struct [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] no_context {
  ~no_context() {}  // NOLINT(modernize-use-equals-default)
};

}  // namespace loom
