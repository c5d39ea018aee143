#include "builtin_combinations.hpp"

#include <loom/strategy/ddp.hpp>

namespace loom::runtime::builtin {

std::vector<std::vector<registry_entry>> ddp_entries() {
  return entries(preset<ddp>{"ddp", "loom::ddp", [] { return ddp{}; }},
                 preset<ddp_fork>{"ddp_fork", "loom::ddp_fork", [] { return ddp_fork{}; }},
                 preset<ddp>{"ddp_find_unused_parameters_true", "loom::ddp (find_unused_parameters = true)",
                             [] { return ddp_find_unused_parameters_true(); }},
                 preset<ddp>{"ddp_find_unused_parameters_false", "loom::ddp (find_unused_parameters = false)",
                             [] { return ddp{}; }});
}

}  // namespace loom::runtime::builtin
