// Single-process defaults for a Strategy: one rank, no communication, module
// moved to the root device. single_device is this; distributed strategies
// inherit it and hide what they change.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/state.hpp>
#include <loom/comm/reduce_op.hpp>
#include <loom/compat.hpp>
#include <loom/concepts.hpp>
#include <loom/concepts/compatibility_rules.hpp>
#include <loom/errors.hpp>
#include <loom/strategy/collectives.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/clip_gradients.hpp>
#include <loom/util/module_fwd.hpp>
#include <loom/util/no_context.hpp>

#include <c10/core/Device.h>
#include <torch/optim/optimizer.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

struct strategy_base {
  using loom_concept = strategy_tag;

  // One process: `devices` must select one device, on one node.
  void setup_environment(const strategy_environment& environment) {
    const device_selection selection = environment.parse_devices(environment.requested);
    const rules::strategy_facts one_process{.name = environment.strategy};
    if (rules::processes_fit(one_process, static_cast<int>(selection.count()), environment.num_nodes) !=
        rules::rule::none) {
      throw configuration_error("strategy '" + std::string(environment.strategy) + "': devices=" +
                                environment.requested.to_string() + " and num_nodes=" +
                                std::to_string(environment.num_nodes) + " ask for " +
                                std::to_string(selection.count() * environment.num_nodes) + " processes; " +
                                std::string(rules::reason(rules::rule::one_process)));
    }
    device_ = environment.device_of(selection, 0);
  }

  c10::Device root_device() const noexcept { return device_; }
  constexpr int world_size() const noexcept { return 1; }
  constexpr int global_rank() const noexcept { return 0; }
  constexpr int local_rank() const noexcept { return 0; }
  constexpr int node_rank() const noexcept { return 0; }
  constexpr bool is_global_zero() const noexcept { return true; }

  // What a strategy keeps per set-up module (DDP: its gradient reducer); the
  // wrapped module holds it and hands it back to forward and no_backward_sync.
  struct no_module_state {};
  using module_state = no_module_state;

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true) {
    if (move_to_device) detail::move_module(module, device_);
    return {};
  }

  // Runs the module's forward. Distributed strategies prepare gradient
  // synchronisation here; one process has nothing to do.
  template <class State, class Forward>
  decltype(auto) forward(State& /*state*/, torch::nn::Module& /*module*/, Forward&& run) {
    return std::forward<Forward>(run)();
  }

  // The precision scales the loss (16-mixed); engines that own backward
  // (ZeRO's accumulation) hide this.
  template <class P>
  void backward(P& precision, const at::Tensor& loss) {
    precision.backward(loss);
  }

  // As asked (optimizer.zero_grad(set_to_none) on every LibTorch version).
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) { compat::zero_grad(optimizer, set_to_none); }

  template <class P>
  void optimizer_step(P& precision, torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    precision.optimizer_step(optimizer, slot);
  }

  // Clips by value, or by norm and returns the total norm. Local: right when
  // every rank holds the whole gradient (one process, DDP); sharded
  // strategies reduce the norm over their shards.
  template <class State>
  std::optional<double> clip_gradients(State& /*state*/, torch::nn::Module& module, const clip_options& options) {
    return detail::clip_gradient_values(module, options);
  }

  // ------------------------------------------------------------ checkpoints
  // One file with every entry, written atomically by this (the only) process.
  void save_checkpoint(const std::string& path, const state& checkpoint, const state_filter& filter,
                       const checkpoint_metadata& metadata) {
    loom::save_checkpoint(path, checkpoint, filter, metadata);
  }
  state load_checkpoint(const std::string& path, const state& checkpoint, bool strict) {
    return loom::load_checkpoint(path, checkpoint, strict);
  }

  void barrier() {}

  // Collectives on one process are identities, with no communication; they
  // still refuse what the multi-process ones refuse (mean of integers).
  template <class T>
  auto all_reduce(T&& value, reduce_op op = reduce_op::sum) {
    return apply_to_collection(std::forward<T>(value), [op](const at::Tensor& tensor) {
      collectives::check_mean_dtype(tensor, op);
      return tensor;
    });
  }
  void all_reduce_(at::Tensor& tensor, reduce_op op = reduce_op::sum) { collectives::check_mean_dtype(tensor, op); }
  // Lightning adds no dimension on one process ("kept for backward compatibility").
  template <class T>
  auto all_gather(T&& value, bool /*sync_grads*/ = false) {
    return apply_to_collection(std::forward<T>(value), [](const at::Tensor& tensor) { return tensor; });
  }
  template <class T>
  auto all_gather_per_rank(T&& value) {
    return apply_to_collection(std::forward<T>(value),
                               [](const at::Tensor& tensor) { return std::vector<at::Tensor>{tensor}; });
  }
  template <class T>
  auto broadcast(T&& value, int /*source*/ = 0) {
    return apply_to_collection(std::forward<T>(value), [](const at::Tensor& tensor) { return tensor; });
  }
  template <class T>
  auto reduce_scatter(T&& value, reduce_op op = reduce_op::sum) {
    return apply_to_collection(std::forward<T>(value), [op](const at::Tensor& tensor) {
      collectives::check_mean_dtype(tensor, op);
      return tensor;
    });
  }
  c10::IValue broadcast_object(const c10::IValue& value, int /*source*/ = 0) { return value; }
  bool reduce_boolean_decision(bool decision, bool /*all*/ = true) { return decision; }

 protected:
  c10::Device device_{c10::DeviceType::CPU};
};

}  // namespace loom
