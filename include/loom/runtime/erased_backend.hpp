// AnyFabric's backend: basic_fabric's calls, each one indirect call into the
// compiled Fabric<A, S, P> behind runtime::fabric_interface. Collectives take
// the same nested containers as the static Fabric's, one call per tensor.
#pragma once

#include <loom/runtime/any_guard.hpp>
#include <loom/runtime/fabric_interface.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/decided.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <type_traits>
#include <utility>

namespace loom::runtime {

// wrapped_module's session over the erased one (wrap/module.hpp lists what a
// session offers). forward keeps the output on the caller's stack with its
// own type; the strategy sees it through output_ref.
class erased_session {
 public:
  static constexpr decided io_conversion = decided::at_run_time;

  explicit erased_session(std::unique_ptr<module_session> session) noexcept : session_(std::move(session)) {}

  bool converts_io() const noexcept { return session_->converts_io(); }
  any_guard forward_context() {
    return any_guard([this](any_guard& guard) { session_->forward_context(guard); });
  }
  template <class Body>
  auto forward(torch::nn::Module& module, Body&& body) {
    using output_t = std::remove_cvref_t<std::invoke_result_t<Body&>>;
    std::optional<output_t> output;
    auto run = [&] { output.emplace(body()); };
    session_->forward(module, run, output_ref(output));
    return std::move(*output);
  }
  at::Tensor convert_input(const at::Tensor& tensor) const { return session_->convert_input(tensor); }
  at::Tensor convert_output(const at::Tensor& tensor) const { return session_->convert_output(tensor); }
  std::optional<double> clip_gradients(torch::nn::Module& module, const clip_options& options) {
    return session_->clip_gradients(module, options);
  }
  any_guard no_backward_sync(bool enabled) {
    return any_guard([this, enabled](any_guard& guard) { session_->no_backward_sync(guard, enabled); });
  }

 private:
  std::unique_ptr<module_session> session_;
};

class erased_stepper {
 public:
  explicit erased_stepper(fabric_interface& fabric) noexcept : fabric_(&fabric) {}
  void step(torch::optim::Optimizer& optimizer, optimizer_slot slot) { fabric_->optimizer_step(optimizer, slot); }
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) { fabric_->zero_grad(optimizer, set_to_none); }

 private:
  fabric_interface* fabric_;
};

class erased_backend {
 public:
  using session_type = erased_session;
  using stepper_type = erased_stepper;
  static constexpr decided joint_setup = decided::at_run_time;
  static constexpr decided distributed_sampler = decided::at_run_time;
  static constexpr decided skip_backward_sync = decided::at_run_time;

  explicit erased_backend(std::unique_ptr<fabric_interface> fabric) noexcept : fabric_(std::move(fabric)) {}

  fabric_interface& erased() noexcept { return *fabric_; }

  std::string_view accelerator_name() const noexcept { return fabric_->accelerator_name(); }
  // The registered name it was built from ("ddp_find_unused_parameters_true").
  std::string_view strategy_name() const noexcept { return fabric_->registered_name(); }
  std::string_view precision_name() const noexcept { return fabric_->precision_name(); }
  bool needs_joint_setup() const noexcept { return fabric_->needs_joint_setup(); }
  bool needs_distributed_sampler() const noexcept { return fabric_->needs_distributed_sampler(); }
  bool supports_no_backward_sync() const noexcept { return fabric_->supports_no_backward_sync(); }

  void launch() { fabric_->launch(); }
  bool is_forked_child() const noexcept { return fabric_->is_forked_child(); }
  int global_rank() const noexcept { return fabric_->global_rank(); }
  int local_rank() const noexcept { return fabric_->local_rank(); }
  int node_rank() const noexcept { return fabric_->node_rank(); }
  int world_size() const noexcept { return fabric_->world_size(); }
  int sampler_replicas() { return fabric_->sampler_replicas(); }
  int sampler_rank() { return fabric_->sampler_rank(); }
  c10::Device device() const noexcept { return fabric_->device(); }

  erased_session setup_module(torch::nn::Module& module, bool move_to_device) {
    return erased_session(fabric_->setup_module(module, move_to_device));
  }
  erased_session setup_module_jointly(torch::nn::Module& module, std::span<torch::optim::Optimizer* const> optimizers) {
    return erased_session(fabric_->setup_module_jointly(module, optimizers));
  }
  erased_stepper stepper() noexcept { return erased_stepper(*fabric_); }
  optimizer_slot next_optimizer_slot(torch::optim::Optimizer& optimizer) {
    return fabric_->next_optimizer_slot(optimizer);
  }
  void unscale_gradients(torch::optim::Optimizer& optimizer, optimizer_slot slot) {
    fabric_->unscale_gradients(optimizer, slot);
  }
  void backward(const at::Tensor& loss) { fabric_->backward(loss); }

  any_guard autocast() const {
    return any_guard([this](any_guard& guard) { fabric_->autocast(guard); });
  }
  any_guard init_context() const {
    return any_guard([this](any_guard& guard) { fabric_->init_context(guard); });
  }
  any_guard init_module_context(bool empty_init) const {
    return any_guard([this, empty_init](any_guard& guard) { fabric_->init_module_context(guard, empty_init); });
  }

  void barrier() { fabric_->barrier(); }
  template <class T>
  auto all_reduce(T&& value, reduce_op op) {
    return apply_to_collection(std::forward<T>(value), [this, op](const at::Tensor& t) { return fabric_->all_reduce(t, op); });
  }
  void all_reduce_(at::Tensor& tensor, reduce_op op) { fabric_->all_reduce_(tensor, op); }
  template <class T>
  auto all_gather(T&& value, bool sync_grads) {
    return apply_to_collection(std::forward<T>(value),
                       [this, sync_grads](const at::Tensor& t) { return fabric_->all_gather(t, sync_grads); });
  }
  template <class T>
  auto all_gather_per_rank(T&& value) {
    return apply_to_collection(std::forward<T>(value), [this](const at::Tensor& t) { return fabric_->all_gather_per_rank(t); });
  }
  template <class T>
  auto broadcast(T&& value, int source) {
    return apply_to_collection(std::forward<T>(value),
                       [this, source](const at::Tensor& t) { return fabric_->broadcast(t, source); });
  }
  template <class T>
  auto reduce_scatter(T&& value, reduce_op op) {
    return apply_to_collection(std::forward<T>(value),
                       [this, op](const at::Tensor& t) { return fabric_->reduce_scatter(t, op); });
  }
  c10::IValue broadcast_object(const c10::IValue& value, int source) {
    return fabric_->broadcast_object(value, source);
  }
  bool reduce_boolean_decision(bool decision, bool all) { return fabric_->reduce_boolean_decision(decision, all); }

  void save(const std::string& path, const state& checkpoint, const state_filter& filter) {
    fabric_->save(path, checkpoint, filter);
  }
  state load(const std::string& path, const state& checkpoint, bool strict) {
    return fabric_->load(path, checkpoint, strict);
  }

 private:
  std::unique_ptr<fabric_interface> fabric_;
};

}  // namespace loom::runtime
