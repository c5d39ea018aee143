// The built-in names, one src/runtime/builtin_*.cpp per strategy family, so
// two cores build them in parallel and user TUs that use only strings
// instantiate nothing.
#pragma once

#include <loom/runtime/register_strategy.hpp>

#include <loom/strategy/process_options.hpp>

#include <vector>

namespace loom::runtime::builtin {

using runtime::entries;
using runtime::preset;

// Defined one per TU, listed once in builtin_families.def.
#define LOOM_BUILTIN_FAMILY(family) std::vector<std::vector<registry_entry>> family##_entries();
#include "builtin_families.def"
#undef LOOM_BUILTIN_FAMILY

// The process options every distributed strategy reads, under Lightning's
// names: timeout (seconds, as its timedelta), the watchdog's
// collective_timeout (seconds, 0: off) and process_group_backend. The
// launcher is the preset's (ddp vs ddp_fork), not an option.
void read_process_options(option_reader& reader, process_options& options);

}  // namespace loom::runtime::builtin
