// The built-in names, one src/runtime/builtin_*.cpp per strategy family, so
// two cores build them in parallel and user TUs that use only strings
// instantiate nothing.
#pragma once

#include <loom/runtime/register_strategy.hpp>

#include <loom/comm/capabilities.hpp>

#include <chrono>
#include <vector>

namespace loom::runtime::builtin {

using runtime::entries;
using runtime::preset;

// Defined one per TU, listed once in builtin_families.def.
#define LOOM_BUILTIN_FAMILY(family) std::vector<std::vector<registry_entry>> family##_entries();
#include "builtin_families.def"
#undef LOOM_BUILTIN_FAMILY

// The options every parallel strategy reads (timeout and collective_timeout
// in seconds, process_group_backend).
void read_parallel_options(option_reader& reader, std::chrono::milliseconds& timeout, comm::backend& backend,
                           std::chrono::milliseconds& collective_timeout);

}  // namespace loom::runtime::builtin
