#include "optimizer_families.hpp"

#include <loom/compat.hpp>

namespace loom::detail {

bool for_each_state_tensor(torch::optim::Optimizer& optimizer,
                           const std::function<void(const at::Tensor& parameter, std::string_view field,
                                                    at::Tensor& value)>& visit) {
  return with_family(optimizer, [&](const auto& family) {
    using state_type = typename std::remove_cvref_t<decltype(family)>::state_type;
    for (auto& group : optimizer.param_groups()) {
      for (const auto& parameter : group.params()) {
        auto found = optimizer.state().find(compat::optimizer_state_key(parameter));
        if (found == optimizer.state().end()) continue;
        auto& per_parameter = static_cast<state_type&>(*found->second);
        for (const auto& [name, field] : family.tensors) visit(parameter, name, field(per_parameter));
      }
    }
  });
}

}  // namespace loom::detail
