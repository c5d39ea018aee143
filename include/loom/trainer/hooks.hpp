// The hooks only loom's trainer calls: their arguments are the trainer's own
// types, so the callback layer below cannot bind them unasked. A callback
// that implements one lists it: `using loom_hooks = loom::trainer_hooks;`
// (a callback with such a member that does not list it is a compile error).
#pragma once

#include <loom/callbacks/hook.hpp>

#include <tuple>

namespace loom {

class fit_context;

// At the start of fit, with the view of the fit a callback may keep (valid
// until fit returns).
LOOM_DECLARE_HOOK(on_fit_start, fit_context& /*fit*/);

using trainer_hooks = std::tuple<on_fit_start>;

}  // namespace loom
