// loom::Fabric<Accelerator, Strategy, Precision>: Lightning Fabric's API with
// the three policies as types. Orchestration only: every decision lives in a
// policy, and the per-step path (forward, backward, step, collectives) is
// resolved by the compiler. The API itself is basic_fabric's, shared with
// AnyFabric; this class adds what only the static Fabric has: the policies.
#pragma once

#include <loom/accelerator/cpu.hpp>
#include <loom/basic_fabric.hpp>
#include <loom/fabric_options.hpp>
#include <loom/precision/true_precision.hpp>
#include <loom/static_backend.hpp>
#include <loom/strategy/single_device.hpp>

#include <utility>

namespace loom {

template <class A, class S = single_device, class P = fp32>
class Fabric : public basic_fabric<Fabric<A, S, P>, static_backend<A, S, P>> {
  using base = basic_fabric<Fabric<A, S, P>, static_backend<A, S, P>>;

 public:
  using accelerator_type = A;
  using strategy_type = S;
  using precision_type = P;

  explicit Fabric(fabric_options options = {}, S strategy = {}, P precision = {})
      : base(std::move(options.loggers), std::move(options.callbacks), options, std::move(strategy),
             std::move(precision)) {}

  // The policy objects themselves (their own members: DDP's options, the grad scaler).
  S& strategy() noexcept { return this->backend().strategy(); }
  P& precision() noexcept { return this->backend().precision(); }
};

}  // namespace loom
