// What LibTorch's unpickler built from a file from outside, walked and taken
// apart without recursion. A pickle can nest containers 10^5 deep (the
// IValue destructor recurses: destroying such a value overflows the stack)
// and can make a list contain itself (any recursive walk never ends).
// Internal to src/checkpoint.
#pragma once

#include "python_pickle.hpp"

#include <ATen/core/ivalue.h>

#include <functional>
#include <optional>
#include <string>

namespace loom::detail {

// The pickle's walk checked this already; checked again here on what the
// unpickler built, which a pickle cannot nest deeper than its opcodes do.
inline constexpr int unpickled_depth_limit = pickle_depth_limit;

// Calls visit(value, place) for every non-container value under root, each
// shared container once ("place" names where: 'model'['fc.weight'][0]).
// Returns the refusal, without visiting further, when a container contains
// itself or the nesting is deeper than unpickled_depth_limit.
std::optional<std::string> walk_unpickled(const c10::IValue& root,
                                          const std::function<void(const c10::IValue&, const std::string&)>& visit);

// Takes value apart without recursion (and breaks any cycle), so nothing
// deep is left for the destructor.
void dismantle(c10::IValue value);

}  // namespace loom::detail
