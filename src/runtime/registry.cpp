#include "builtin_combinations.hpp"

#include <loom/any_fabric.hpp>
#include <loom/errors.hpp>
#include <loom/runtime/registry.hpp>

#include <algorithm>
#include <iostream>
#include <mutex>
#include <set>

namespace loom::runtime {

registry& registry::instance() {
  static registry* shared = [] {
    auto* made = new registry();  // never destroyed: factories may run during static destruction
    for (auto* group : {
#define LOOM_BUILTIN_FAMILY(family) &builtin::family##_entries,
#include "builtin_families.def"
#undef LOOM_BUILTIN_FAMILY
         }) {
      for (const auto& named : (*group)()) made->add_strategy(named);
    }
    return made;
  }();
  return *shared;
}

void registry::add_strategy(const std::vector<registry_entry>& entries, registration_options options) {
  if (entries.empty()) throw configuration_error("register a strategy: no combination of it can run in this build");
  const std::string& name = entries.front().strategy;
  for (const auto& entry : entries) {
    if (entry.strategy != name) throw configuration_error("register a strategy: entries name several strategies");
  }
  if (name.empty() || name == "auto") {
    throw configuration_error("register a strategy: '" + name + "' cannot be a strategy name");
  }
  if (has_strategy(name)) {
    if (!options.override_existing) {
      throw configuration_error("strategy '" + name + "' is already registered; pass {.override_existing = true} "
                                "to replace it");
    }
    std::erase_if(entries_, [&](const registry_entry& entry) { return entry.strategy == name; });
  }
  entries_.insert(entries_.end(), entries.begin(), entries.end());
  const strategy_name* lightning = runtime::find_strategy(name);
  if (lightning == nullptr || !lightning->built) {
    std::erase_if(user_names_, [&](const strategy_name& known) { return known.name == name; });
    const registry_entry& first = entries.front();
    user_names_.push_back({name, true, "", first.description, first.multi_process, first.devices, first.sharded,
                           first.scales_own_loss});
  }
}

const registry_entry* registry::find(std::string_view accelerator, std::string_view strategy,
                                     std::string_view precision) const {
  for (const auto& entry : entries_) {
    if (entry.accelerator == accelerator && entry.strategy == strategy && entry.precision == precision) return &entry;
  }
  return nullptr;
}

bool registry::has_strategy(std::string_view name) const {
  return std::any_of(entries_.begin(), entries_.end(), [&](const registry_entry& e) { return e.strategy == name; });
}

std::vector<std::string> registry::strategy_names() const {
  std::vector<std::string> out;
  for (const auto& entry : entries_) {
    if (std::find(out.begin(), out.end(), entry.strategy) == out.end()) out.push_back(entry.strategy);
  }
  return out;
}

machine_facts registry::machine(int cuda_devices, bool cuda_built) const {
  machine_facts facts = builtin_machine(cuda_devices, cuda_built);
  facts.available_strategies = strategy_names();
  facts.find_strategy = [this](std::string_view name) -> const strategy_name* {
    for (const auto& known : user_names_) {
      if (known.name == name) return &known;
    }
    return runtime::find_strategy(name);
  };
  return facts;
}

}  // namespace loom::runtime

namespace loom {

namespace runtime {

resolution resolve(const fabric_config& config, std::optional<strategy_name> strategy_object) {
  auto& shared = registry::instance();
  const bool cuda_built = cuda::built_with_cuda();
  const machine_facts machine = shared.machine(cuda_built ? cuda::device_count() : 0, cuda_built);
  connector_input input;
  input.accelerator = config.accelerator;
  input.strategy = config.strategy;
  input.devices = config.devices;
  input.precision = config.precision;
  input.num_nodes = config.num_nodes;
  input.strategy_object = std::move(strategy_object);
  resolution out;
  out.chosen = connect(std::move(input), machine);
  const auto& cluster = out.chosen.cluster;
  if (cluster.global_rank.value_or(0) == 0 && cluster.node_rank == 0 && cluster.local_rank == 0) {
    // Once per process each, as Python's default warnings filter shows them:
    // an application that resolves before make_fabric (to pick options by
    // the chosen strategy) does not see them twice.
    static std::mutex printed_mutex;
    static std::set<std::string> printed;
    std::lock_guard<std::mutex> lock(printed_mutex);
    for (const auto& warning : out.chosen.warnings) {
      if (printed.insert(warning).second) std::cerr << "loom: warning: " << warning << '\n';
    }
  }
  out.options.devices = out.chosen.devices;
  out.options.num_nodes = out.chosen.num_nodes;
  out.options.checked_by_connector = true;
  return out;
}

}  // namespace runtime

AnyFabric make_fabric(fabric_config config) {
  auto& shared = runtime::registry::instance();
  runtime::resolution resolved = runtime::resolve(config, std::nullopt);
  const runtime::connection& chosen = resolved.chosen;
  const runtime::registry_entry* entry = shared.find(chosen.accelerator, chosen.strategy, chosen.precision);
  if (!shared.has_strategy(chosen.strategy)) {
    // Built, but only as an object (model_parallel: its parallelize_fn).
    const runtime::strategy_name* known = runtime::find_strategy(chosen.strategy);
    throw configuration_error("strategy '" + chosen.strategy + "' cannot be made from its name: " +
                              (known && !known->reason.empty() ? known->reason : std::string("it is not registered")));
  }
  if (entry == nullptr) {
    std::string offered;
    for (const auto& candidate : shared.entries()) {
      if (candidate.strategy == chosen.strategy && candidate.accelerator == chosen.accelerator) {
        offered += (offered.empty() ? "" : ", ") + candidate.precision;
      }
    }
    throw configuration_error("strategy '" + chosen.strategy + "' on accelerator '" + chosen.accelerator +
                              "' is not built with precision '" + chosen.precision + "'. Built precisions for it: " +
                              (offered.empty() ? std::string("none") : offered));
  }
  runtime::option_reader reader(chosen.strategy, config.strategy_options);
  return AnyFabric(entry->make(std::move(resolved.options), reader), std::move(config.loggers), std::move(config.callbacks),
                   chosen.warnings);
}

}  // namespace loom
