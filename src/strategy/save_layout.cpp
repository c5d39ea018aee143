// The save layout of a sharded checkpoint (fsdp_engine.hpp), read off the
// parameters' placements: one rule for fsdp, deepspeed and model_parallel.
#include <loom/checkpoint/state.hpp>
#include <loom/errors.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/full_state.hpp>

#include <torch/nn/module.h>

#include <unordered_map>

namespace loom::detail {

namespace {

// Each name in a checkpoint's modules must name one tensor (a tied weight is
// one tensor under two names, which is fine; one name for two tensors is not).
void claim_name(std::map<std::string, const void*>& owners, const std::string& name, const void* parameter,
                std::string_view strategy) {
  const auto [owner, fresh] = owners.emplace(name, parameter);
  if (!fresh && owner->second != parameter) {
    throw configuration_error(std::string(strategy) + ": two modules in this checkpoint have a parameter named '" +
                              name + "', and a sharded checkpoint keys each slice by parameter name; save each "
                              "model to its own path (fabric.save(path_g, {{\"model\", g}, ...}))");
  }
}

}  // namespace

shard_layout sharded_save_layout(const state& checkpoint, const std::vector<std::weak_ptr<fsdp_engine>>& engines,
                                 std::string_view strategy, std::map<const void*, std::string>* names) {
  for (const auto& entry : checkpoint.entries()) {
    if (auto* optimizer = entry.io().optimizer(); optimizer && !fsdp_engine::knows_state_layout(*optimizer)) {
      throw configuration_error(std::string(strategy) + ": '" + entry.name() +
                                "' is an optimizer whose state loom cannot slice (SGD, Adam, AdamW, RMSprop and "
                                "Adagrad are known); a sharded save could not be resharded or consolidated");
    }
  }
  std::unordered_map<const void*, shard_range> ranges;
  for (const auto& where : placements_of(engines, checkpoint.modules())) {
    if (auto range = save_range(where)) ranges.emplace(where.parameter.unsafeGetTensorImpl(), std::move(*range));
  }
  shard_layout layout;
  std::map<std::string, const void*> owners;
  for (const torch::nn::Module* module : checkpoint.modules()) {
    for (const auto& item : module->named_parameters()) {
      const void* parameter = item.value().unsafeGetTensorImpl();
      claim_name(owners, item.key(), parameter, strategy);
      if (names != nullptr) names->emplace(parameter, item.key());
      if (auto range = ranges.find(parameter); range != ranges.end()) layout[item.key()] = range->second;
    }
  }
  return layout;
}

}  // namespace loom::detail
