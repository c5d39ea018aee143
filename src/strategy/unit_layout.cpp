#include <loom/strategy/unit_layout.hpp>

#include <loom/strategy/unit.hpp>

#include <torch/nn/module.h>

#include <unordered_set>

namespace loom {

namespace {

// Depth first, in module order: `into` collects this module's parameters
// not yet seen; a unit below starts an entry of its own.
void walk(torch::nn::Module& module, std::size_t into, std::vector<std::vector<at::Tensor>>& units,
          std::unordered_set<const void*>& seen) {
  for (const auto& p : module.parameters(/*recurse=*/false)) {
    if (seen.insert(p.unsafeGetTensorImpl()).second) units[into].push_back(p);
  }
  for (const auto& child : module.children()) {
    if (dynamic_cast<unit_marker*>(child.get()) != nullptr) {
      units.emplace_back();
      walk(*child, units.size() - 1, units, seen);
    } else {
      walk(*child, into, units, seen);
    }
  }
}

}  // namespace

std::vector<std::vector<at::Tensor>> unit_parameters(torch::nn::Module& root) {
  std::vector<std::vector<at::Tensor>> units(1);
  std::unordered_set<const void*> seen;
  walk(root, 0, units, seen);
  return units;
}

}  // namespace loom
