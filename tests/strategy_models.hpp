// Models of the Strategy and Precision contracts written from scratch
// (inheriting nothing from loom): bare_strategy<member::none> has every
// member of every layer; bare_strategy<member::X> lacks exactly X, so the
// tests show which layer each member belongs to and the compile-fail cases
// show the sentence that names it. Each member counts its calls, so a test
// can prove that Fabric routes the step through the strategy.
#pragma once

#include <loom/loom.hpp>

#include <torch/nn/module.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/optimizer.h>

#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace models {

enum class member {
  none,
  setup_environment,
  ranks,
  barrier,
  module_state,
  setup_module,
  forward,
  backward,
  optimizer_step,
  zero_grad,
  clip_gradients,
  no_backward_sync,
  save_checkpoint,
  load_checkpoint,
  all_reduce,
  all_gather,
  broadcast,
  reduce_scatter,
  reduce_boolean_decision,
  joint_setup,
};

// What a bare strategy was asked to do.
struct strategy_calls {
  std::map<std::string, int> count;
  std::vector<torch::optim::Optimizer*> jointly_set_up;
};

struct empty_state {};
struct empty_guard {
  ~empty_guard() {}  // NOLINT(modernize-use-equals-default)
};

// module_state declared, or (for the negative model) not.
template <bool Declared>
struct module_state_declaration {
  using module_state = empty_state;
};
template <>
struct module_state_declaration<false> {};

template <member Missing = member::none, bool Joint = false>
struct bare_strategy : module_state_declaration<Missing != member::module_state> {
  using loom_concept = loom::strategy_tag;
  static constexpr std::string_view name = "bare";
  static constexpr bool supports_no_backward_sync = true;
  static constexpr bool needs_joint_setup = Joint;

  strategy_calls* calls = nullptr;  // set by the test; counts are skipped when null
  void note(const char* what) {
    if (calls != nullptr) ++calls->count[what];
  }

  // -- layer 1: processes
  void setup_environment(const loom::strategy_environment& /*environment*/)
    requires(Missing != member::setup_environment)
  {}
  c10::Device root_device() const requires(Missing != member::ranks) { return c10::Device(c10::DeviceType::CPU); }
  int world_size() const requires(Missing != member::ranks) { return 1; }
  int global_rank() const requires(Missing != member::ranks) { return 0; }
  int local_rank() const requires(Missing != member::ranks) { return 0; }
  int node_rank() const requires(Missing != member::ranks) { return 0; }
  void barrier() requires(Missing != member::barrier) { note("barrier"); }

  // -- layer 2: modules
  empty_state setup_module(torch::nn::Module& /*module*/, bool /*move_to_device*/)
    requires(Missing != member::setup_module)
  {
    note("setup_module");
    return {};
  }
  empty_state setup_module_and_optimizers(torch::nn::Module& /*module*/,
                                          std::span<torch::optim::Optimizer* const> optimizers,
                                          bool /*move_to_device*/)
    requires(Missing != member::joint_setup)
  {
    note("setup_module_and_optimizers");
    if (calls != nullptr) calls->jointly_set_up.assign(optimizers.begin(), optimizers.end());
    return {};
  }
  template <class Forward>
    requires(Missing != member::forward)
  decltype(auto) forward(empty_state& /*state*/, torch::nn::Module& /*module*/, Forward&& run) {
    note("forward");
    return run();
  }

  // -- layer 3: the training step
  template <class P>
    requires(Missing != member::backward)
  void backward(P& precision, const at::Tensor& loss) {
    note("backward");
    precision.backward(loss);
  }
  template <class P>
    requires(Missing != member::optimizer_step)
  void optimizer_step(P& precision, torch::optim::Optimizer& optimizer, loom::optimizer_slot slot) {
    note("optimizer_step");
    precision.optimizer_step(optimizer, slot);
  }
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) requires(Missing != member::zero_grad) {
    note("zero_grad");
    loom::compat::zero_grad(optimizer, set_to_none);
  }
  std::optional<double> clip_gradients(empty_state& /*state*/, torch::nn::Module& module,
                                       const loom::clip_options& options)
    requires(Missing != member::clip_gradients)
  {
    note("clip_gradients");
    return torch::nn::utils::clip_grad_norm_(module.parameters(), *options.max_norm, options.norm_type);
  }
  empty_guard no_backward_sync(empty_state& /*state*/, bool /*enabled*/)
    requires(Missing != member::no_backward_sync)
  {
    note("no_backward_sync");
    return {};
  }

  // -- layer 4: checkpoints
  void save_checkpoint(const std::string& path, const loom::state& checkpoint, const loom::state_filter& filter,
                       const loom::checkpoint_metadata& metadata)
    requires(Missing != member::save_checkpoint)
  {
    note("save_checkpoint");
    loom::save_checkpoint(path, checkpoint, filter, metadata);
  }
  loom::state load_checkpoint(const std::string& path, const loom::state& checkpoint, bool strict)
    requires(Missing != member::load_checkpoint)
  {
    note("load_checkpoint");
    return loom::load_checkpoint(path, checkpoint, strict);
  }

  // -- layer 5: collectives (one process: identities)
  at::Tensor all_reduce(const at::Tensor& tensor, loom::reduce_op /*op*/) requires(Missing != member::all_reduce) {
    note("all_reduce");
    return tensor;
  }
  void all_reduce_(at::Tensor& /*tensor*/, loom::reduce_op /*op*/) requires(Missing != member::all_reduce) {}
  at::Tensor all_gather(const at::Tensor& tensor, bool /*sync_grads*/) requires(Missing != member::all_gather) {
    return tensor;
  }
  std::vector<at::Tensor> all_gather_per_rank(const at::Tensor& tensor) requires(Missing != member::all_gather) {
    return {tensor};
  }
  at::Tensor broadcast(const at::Tensor& tensor, int /*source*/) requires(Missing != member::broadcast) {
    return tensor;
  }
  c10::IValue broadcast_object(const c10::IValue& value, int /*source*/) requires(Missing != member::broadcast) {
    return value;
  }
  at::Tensor reduce_scatter(const at::Tensor& tensor, loom::reduce_op /*op*/)
    requires(Missing != member::reduce_scatter)
  {
    return tensor;
  }
  bool reduce_boolean_decision(bool decision, bool /*all*/) requires(Missing != member::reduce_boolean_decision) {
    return decision;
  }
};

// A precision written from scratch: fp32, counting backward and step.
struct bare_precision {
  using loom_concept = loom::precision_tag;
  static constexpr std::string_view name = "bare-32";
  static constexpr c10::ScalarType param_dtype = c10::ScalarType::Float;
  static constexpr c10::ScalarType compute_dtype = c10::ScalarType::Float;
  static constexpr bool is_mixed = false;
  static constexpr bool converts_io = false;
  int backwards = 0;
  int steps = 0;

  void convert_module(torch::nn::Module& /*module*/) {}
  at::Tensor convert_input(const at::Tensor& tensor) const { return tensor; }
  at::Tensor convert_output(const at::Tensor& tensor) const { return tensor; }
  empty_guard forward_context(c10::DeviceType /*device*/) const { return {}; }
  empty_guard init_context() const { return {}; }
  void backward(const at::Tensor& loss) {
    ++backwards;
    loss.backward();
  }
  void optimizer_step(torch::optim::Optimizer& optimizer, loom::optimizer_slot /*slot*/) {
    ++steps;
    optimizer.step();
  }
  void unscale_gradients(torch::optim::Optimizer& /*optimizer*/, loom::optimizer_slot /*slot*/) {}
};

}  // namespace models
