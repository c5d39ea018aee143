// The built-in names, one src/runtime/builtin_*.cpp per strategy family, so
// two cores build them in parallel and user TUs that use only strings
// instantiate nothing.
#pragma once

#include <loom/runtime/register_strategy.hpp>

#include <vector>

namespace loom::runtime::builtin {

using runtime::entries;
using runtime::preset;

// Defined one per TU.
std::vector<std::vector<registry_entry>> single_device_entries();
std::vector<std::vector<registry_entry>> parallel_entries();
std::vector<std::vector<registry_entry>> ddp_entries();

}  // namespace loom::runtime::builtin
