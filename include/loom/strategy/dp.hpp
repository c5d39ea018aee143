// DataParallel (Lightning's "dp", DataParallelStrategy): one process, the
// module replicated on each of its devices, each batch split along dimension
// 0, replicas run in threads (each entering the precision's autocast, which
// is per thread), outputs gathered on the root device, gradients summed into
// the root module's parameters by autograd (data_parallel_replicas.hpp).
// As Lightning's: all_reduce is the mean over a collection (of the replicas'
// outputs), barrier and broadcast do nothing, no distributed sampler.
//
// It runs on cuda only: on cpu the string path (make_fabric, loom-run) falls
// back to ddp with Lightning's warning, and the static Fabric<cpu, dp, P> is a
// compile error saying to use ddp. The mechanics run with every replica on
// the CPU through detail::data_parallel_forward, which is how they are tested.
#pragma once

#include <loom/strategy/data_parallel_replicas.hpp>
#include <loom/strategy/strategy_base.hpp>

#include <memory>
#include <string_view>
#include <utility>
#include <vector>

namespace loom {

struct dp : strategy_base {
  static constexpr std::string_view name = "dp";
  static constexpr rules::device_types runs_on = {rules::device_type::cuda};
  static constexpr bool supports_no_backward_sync = true;  // nothing to skip: one process
  // Forward takes its arguments (to scatter them): wrapped modules call
  // forward_replicas instead of forward.
  static constexpr bool replicates_forward = true;

  using module_state = std::shared_ptr<detail::replica_set>;

  dp() = default;
  // Lightning's DataParallelStrategy(parallel_devices=...): the devices to
  // replicate on, the first the root. Given, they are kept (any device type:
  // the CPU too, which is how the mechanics are tested); else Fabric's
  // `devices` selects them.
  explicit dp(std::vector<c10::Device> parallel_devices) : devices_(std::move(parallel_devices)) {
    if (devices_.empty()) throw configuration_error("dp: parallel_devices is empty; give at least one device");
    device_ = devices_.front();
    given_ = true;
  }

  // Every selected device of this one process; the first is the root.
  void setup_environment(const strategy_environment& environment) {
    if (environment.num_nodes != 1) {
      throw configuration_error("dp runs one process on one node; num_nodes=" + std::to_string(environment.num_nodes) +
                                " asks for more. Use ddp across nodes");
    }
    if (given_) return;
    const device_selection selection = environment.parse_devices(environment.requested);
    devices_.clear();
    for (int i = 0; i < selection.count(); ++i) devices_.push_back(environment.device_of(selection, i));
    device_ = devices_.front();
  }

  module_state setup_module(torch::nn::Module& module, bool move_to_device = true) {
    if (move_to_device) detail::move_module(module, device_);
    return std::make_shared<detail::replica_set>(module, devices_);
  }

  template <class Impl, class Body, class... Args>
  auto forward_replicas(module_state& replicas, Impl& module, Body&& body, const Args&... arguments) {
    return detail::data_parallel_forward(*replicas, module, std::forward<Body>(body), arguments...);
  }
  // A forward without its arguments (the type-erased Fabric's) cannot be
  // scattered.
  template <class State, class Forward>
  decltype(auto) forward(State& /*state*/, torch::nn::Module& /*module*/, Forward&& run) {
    refuse_erased_forward();
    return std::forward<Forward>(run)();  // not reached
  }

  no_context no_backward_sync(module_state& /*state*/, bool /*enabled*/ = true) { return {}; }

  // Lightning's DataParallelStrategy.all_reduce: each tensor's mean (over
  // the replicas' values it holds), in its dtype.
  template <class T>
  auto all_reduce(T&& value, reduce_op /*op*/ = reduce_op::mean) {
    return apply_to_collection(std::forward<T>(value), [](const at::Tensor& tensor) {
      return tensor.to(at::kFloat).mean().to(tensor.scalar_type());
    });
  }

  const std::vector<c10::Device>& devices() const noexcept { return devices_; }

 private:
  [[noreturn]] static void refuse_erased_forward() {
    throw configuration_error("dp scatters forward's arguments, which the type-erased Fabric (make_fabric) does not "
                              "pass; use the static loom::Fabric<loom::cuda, loom::dp, P>");
  }

  std::vector<c10::Device> devices_{c10::Device(c10::kCPU)};
  bool given_ = false;
};

static_assert(Strategy<dp>);

}  // namespace loom
