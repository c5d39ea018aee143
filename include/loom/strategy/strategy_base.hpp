// Single-process defaults for a Strategy: one rank, no communication, module
// moved to the root device. single_device is this; distributed strategies
// inherit it and hide what they change.
#pragma once

#include <loom/concepts.hpp>
#include <loom/precision/precision_base.hpp>

#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <utility>

namespace loom {

// Reduction operators of the collectives.
enum class reduce_op { sum, mean, min, max, product };

struct strategy_base {
  using loom_concept = strategy_tag;

  void setup_environment(const strategy_environment& environment) { device_ = environment.device; }

  c10::Device root_device() const noexcept { return device_; }
  constexpr int world_size() const noexcept { return 1; }
  constexpr int global_rank() const noexcept { return 0; }
  constexpr int local_rank() const noexcept { return 0; }
  constexpr int node_rank() const noexcept { return 0; }
  constexpr bool is_global_zero() const noexcept { return true; }

  void setup_module(torch::nn::Module& module) { module.to(device_); }

  // Runs the module's forward. Distributed strategies prepare gradient
  // synchronisation here; one process has nothing to do.
  template <class Forward>
  decltype(auto) forward(torch::nn::Module& /*module*/, Forward&& run) {
    return std::forward<Forward>(run)();
  }

  template <class P>
  void optimizer_step(P& precision, torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    precision.optimizer_step(optimizer, slot);
  }

  void barrier() {}

  // Collectives on one process are identities, with no communication.
  template <class T>
  T all_reduce(T value, reduce_op /*op*/ = reduce_op::sum) {
    return value;
  }
  template <class T>
  T broadcast(T value, int /*source*/ = 0) {
    return value;
  }
  bool reduce_boolean_decision(bool decision, bool /*all*/ = true) { return decision; }

 protected:
  c10::Device device_{c10::DeviceType::CPU};
};

}  // namespace loom
