// make_fabric(config, strategy): a ready strategy object in the string-chosen
// Fabric, as Lightning's Fabric(strategy=DDPStrategy(...)). The connector
// resolves accelerator, devices and precision as for a name (LT_* values,
// fallbacks, the compatibility rules over the object's type); the Fabric is
// instantiated here, in the caller's TU, for every compatible accelerator and
// precision of this build (a Boost.Hana product, as register_strategy).
#pragma once

#include <loom/any_fabric.hpp>
#include <loom/errors.hpp>
#include <loom/runtime/register_strategy.hpp>
#include <loom/runtime/registry.hpp>

#include <memory>
#include <string>

namespace loom {

template <class S>
  requires Strategy<S>
AnyFabric make_fabric(fabric_config config, S strategy) {
  if (!config.strategy_options.empty()) {
    throw configuration_error("make_fabric(config, strategy): the strategy object carries its own options; leave "
                              "strategy_options empty (it holds '" + config.strategy_options + "')");
  }
  if (config.strategy != "auto" && config.strategy != S::name) {
    throw configuration_error("make_fabric(config, strategy): config.strategy is '" + config.strategy +
                              "' but the strategy object is a '" + std::string(S::name) +
                              "'; leave config.strategy as \"auto\" or name the same strategy");
  }
  runtime::strategy_name facts{std::string(S::name), true, "", "the strategy object given to make_fabric",
                               is_distributed<S>, strategy_devices<S>, is_sharded<S>, scales_own_loss<S>};
  runtime::resolution resolved = runtime::resolve(config, std::move(facts));
  std::unique_ptr<runtime::fabric_interface> made;
  namespace hana = boost::hana;
  constexpr auto pairs = hana::cartesian_product(hana::make_tuple(runtime::accelerators, runtime::precisions));
  hana::for_each(pairs, [&](auto pair) {
    using A = typename decltype(+hana::at_c<0>(pair))::type;
    using P = typename decltype(+hana::at_c<1>(pair))::type;
    if constexpr (compatible<A, S, P>) {
      if (!made && resolved.chosen.accelerator == A::name && resolved.chosen.precision == P::name) {
        made = std::make_unique<runtime::fabric_model<A, S, P>>(std::string(S::name), std::move(resolved.options),
                                                                std::move(strategy), P{});
      }
    }
  });
  if (!made) {
    throw configuration_error("make_fabric(config, strategy): strategy '" + std::string(S::name) +
                              "' has no compiled combination with accelerator '" + resolved.chosen.accelerator +
                              "' and precision '" + resolved.chosen.precision + "'");
  }
  return AnyFabric(std::move(made), std::move(config.loggers), std::move(config.callbacks),
                   resolved.chosen.warnings);
}

}  // namespace loom
