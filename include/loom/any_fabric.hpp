// loom::AnyFabric and loom::make_fabric: the Fabric API with the combination
// chosen from strings at run time (config files, command lines, loom-run's
// LT_* variables), among the combinations compiled once in libloom.
//
// Type erasure stops at this edge: each API call (setup, forward, backward,
// step, a collective) is one indirect call into the compiled Fabric<A, S, P>;
// the module's own forward and everything inside it run as written, and this
// header pulls in none of the strategies or precisions.
#pragma once

#include <loom/basic_fabric.hpp>
#include <loom/fabric_options.hpp>
#include <loom/runtime/connector.hpp>
#include <loom/runtime/erased_backend.hpp>
#include <loom/runtime/fabric_interface.hpp>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

// make_fabric's arguments, Lightning Fabric's names and defaults (in this
// order, for designated initializers).
struct fabric_config {
  std::string accelerator = "auto";  // auto | cpu | cuda | gpu (mps, tpu: refused with the reason)
  std::string strategy = "auto";     // a registered name: auto, single_device, ddp, ddp_fork, ...
  // The strategy's options: a JSON object ("{\"bucket_cap_mb\": 50}") or the
  // path of a file holding one; each name lists its keys (docs/configuration.md).
  std::string strategy_options;
  devices_spec devices;              // not given: auto, or what an external launcher started
  runtime::precision_input precision;  // 64 | 32 | 16 | "bf16-mixed" | ...; not given: "32-true"
  int num_nodes = 1;
  std::vector<logger> loggers;
  std::vector<callback> callbacks;
};

// What AnyFabric's setup returns: the user's module and optimizers, bound to
// the erased strategy and precision (one indirect call per forward or step).
template <ModuleHolder Holder>
using any_module = wrapped_module<Holder, runtime::erased_session>;
template <class O>
using any_optimizer = wrapped_optimizer<O, runtime::erased_stepper>;

class AnyFabric : public basic_fabric<AnyFabric, runtime::erased_backend> {
  using base = basic_fabric<AnyFabric, runtime::erased_backend>;

 public:
  // Usually made by make_fabric; here for combinations built by hand.
  AnyFabric(std::unique_ptr<runtime::fabric_interface> fabric, std::vector<logger> loggers,
            std::vector<callback> callbacks, std::vector<std::string> warnings = {})
      : base(std::move(loggers), std::move(callbacks), std::move(fabric)), warnings_(std::move(warnings)) {}

  // The connector's warnings (legacy spellings, fallbacks), already printed on rank zero.
  const std::vector<std::string>& warnings() const noexcept { return warnings_; }
  // The static Fabric inside, when it is a F (else nullptr): the way back to
  // the policies' own members (fabric.strategy(), ...).
  template <class F>
  F* target() noexcept {
    return static_cast<F*>(backend().erased().fabric_if(typeid(F)));
  }
  runtime::fabric_interface& erased() noexcept { return backend().erased(); }

 private:
  std::vector<std::string> warnings_;
};

// Resolves config with Lightning's connector rules (and loom-run's LT_*
// values), then builds the registered combination. Unknown names, conflicts
// and combinations this build cannot run are loom::configuration_error
// naming what was asked and what is accepted.
AnyFabric make_fabric(fabric_config config = {});

}  // namespace loom
