#include "builtin_combinations.hpp"

#include <loom/strategy/parallel.hpp>

namespace loom::runtime::builtin {

std::vector<std::vector<registry_entry>> parallel_entries() {
  return entries(preset<parallel>{"parallel", "loom::parallel", [] { return parallel{}; }},
                 preset<parallel_fork>{"parallel_fork", "loom::parallel_fork", [] { return parallel_fork{}; }});
}

}  // namespace loom::runtime::builtin
