#include "builtin_combinations.hpp"

namespace loom::runtime::builtin {

std::vector<std::vector<registry_entry>> single_device_entries() {
  return entries(preset<single_device>{"single_device", "loom::single_device",
                                       [](option_reader&) { return single_device{}; }});
}

}  // namespace loom::runtime::builtin
