#include "optimizer_families.hpp"

#include <loom/compat.hpp>

#include <unordered_set>

namespace loom::detail {

bool for_each_state_tensor(torch::optim::Optimizer& optimizer,
                           const std::function<void(const at::Tensor& parameter, std::string_view field,
                                                    at::Tensor& value)>& visit) {
  return with_family(optimizer, [&](const auto& family) {
    using state_type = typename std::remove_cvref_t<decltype(family)>::state_type;
    // Once per state: LibTorch's module.parameters() lists a tied weight
    // under each of its names, so an optimizer built from it holds the
    // tensor (and its one state) twice. A second visit would gather or
    // slice that state again.
    std::unordered_set<const void*> visited;
    for (auto& group : optimizer.param_groups()) {
      for (const auto& parameter : group.params()) {
        auto found = optimizer.state().find(compat::optimizer_state_key(parameter));
        if (found == optimizer.state().end() || !visited.insert(found->second.get()).second) continue;
        auto& per_parameter = static_cast<state_type&>(*found->second);
        for (const auto& [name, field] : family.tensors) visit(parameter, name, field(per_parameter));
      }
    }
  });
}

}  // namespace loom::detail
