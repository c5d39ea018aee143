// The registry: names (Lightning's, with their preset parameters) mapped to
// the Fabric<A, S, P> combinations compiled into libloom, plus the names
// users register. make_fabric looks up what the connector resolved.
#pragma once

#include <loom/fabric_options.hpp>
#include <loom/runtime/fabric_interface.hpp>
#include <loom/runtime/connector.hpp>
#include <loom/runtime/names.hpp>
#include <loom/runtime/strategy_options.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom {
struct fabric_config;
}

namespace loom::runtime {

// Builds the combination; the strategy's preset reads its options from the
// reader (every key must be one it knows).
using fabric_factory = std::function<std::unique_ptr<fabric_interface>(fabric_options, option_reader&)>;

// One compiled combination under one strategy name.
struct registry_entry {
  std::string strategy;     // the registered name: "ddp_find_unused_parameters_true"
  std::string description;  // what the name means
  std::string accelerator;  // "cpu" | "cuda"
  std::string precision;    // canonical: "bf16-mixed"
  std::string strategy_type, accelerator_type, precision_type;  // C++ types, for docs
  // The strategy type's facts for the compatibility rules.
  bool multi_process = true;
  rules::device_types devices = rules::device_types::all();
  bool sharded = false;
  bool scales_own_loss = false;
  fabric_factory make;
};

struct registration_options {
  bool override_existing = false;  // replacing a registered name must be asked for
};

// make_fabric's first half: the configuration through the connector (with a
// strategy object's facts in place of a name lookup when one is given), its
// warnings printed on rank zero (each once per process), and the Fabric
// options that follow.
struct resolution {
  connection chosen;
  fabric_options options;
};
resolution resolve(const fabric_config& config, std::optional<strategy_name> strategy_object);

class registry {
 public:
  // The process-wide registry, with the built-in combinations.
  static registry& instance();

  // Adds every entry (one strategy name, several combinations). Throws when
  // the name exists and override_existing is false.
  void add_strategy(const std::vector<registry_entry>& entries, registration_options options = {});
  const registry_entry* find(std::string_view accelerator, std::string_view strategy,
                             std::string_view precision) const;
  bool has_strategy(std::string_view name) const;
  std::vector<std::string> strategy_names() const;  // registration order
  const std::vector<registry_entry>& entries() const noexcept { return entries_; }
  // The names the connector knows: Lightning's catalog with this registry's
  // names marked built, plus user names.
  machine_facts machine(int cuda_devices, bool cuda_built) const;

 private:
  std::vector<registry_entry> entries_;
  std::vector<strategy_name> user_names_;
};

}  // namespace loom::runtime
