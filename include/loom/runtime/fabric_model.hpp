// fabric_interface implemented by a static Fabric<A, S, P>: every member is
// the static Fabric's own code, reached through one virtual call. The
// registry instantiates it once per combination in src/; a user who
// registers a strategy of their own instantiates it in their TU.
#pragma once

#include <loom/fabric.hpp>
#include <loom/runtime/fabric_interface.hpp>

#include <memory>
#include <stdexcept>
#include <string>
#include <typeinfo>
#include <utility>

namespace loom::runtime {

template <class A, class S, class P>
class fabric_model final : public fabric_interface {
 public:
  using fabric_type = Fabric<A, S, P>;

  fabric_model(std::string registered_name, fabric_options options, S strategy = {}, P precision = {})
      : name_(std::move(registered_name)), fabric_(std::move(options), std::move(strategy), std::move(precision)) {}

  fabric_type& fabric() noexcept { return fabric_; }

  std::string_view accelerator_name() const noexcept override { return A::name; }
  std::string_view strategy_name() const noexcept override { return S::name; }
  std::string_view precision_name() const noexcept override { return P::name; }
  const std::string& registered_name() const noexcept override { return name_; }
  void* fabric_if(const std::type_info& type) noexcept override {
    return type == typeid(fabric_type) ? static_cast<void*>(&fabric_) : nullptr;
  }

  void launch() override { backend().launch(); }
  bool is_forked_child() const noexcept override { return backend().is_forked_child(); }
  int global_rank() const noexcept override { return backend().global_rank(); }
  int local_rank() const noexcept override { return backend().local_rank(); }
  int node_rank() const noexcept override { return backend().node_rank(); }
  int world_size() const noexcept override { return backend().world_size(); }
  int sampler_replicas() override { return backend().sampler_replicas(); }
  int sampler_rank() override { return backend().sampler_rank(); }
  c10::Device device() const noexcept override { return backend().device(); }
  bool needs_distributed_sampler() const noexcept override { return backend().needs_distributed_sampler(); }
  bool supports_no_backward_sync() const noexcept override { return backend().supports_no_backward_sync(); }
  bool needs_joint_setup() const noexcept override { return backend().needs_joint_setup(); }

  // The facade refuses the wrong kind of setup before it reaches here.
  std::unique_ptr<module_session> setup_module(torch::nn::Module& module, bool move_to_device) override {
    if constexpr (loom::needs_joint_setup<S>) throw std::logic_error("fabric_model: " + name_ + " needs joint setup");
    else return std::make_unique<session>(backend().setup_module(module, move_to_device));
  }
  std::unique_ptr<module_session> setup_module_jointly(torch::nn::Module& module,
                                                       std::span<torch::optim::Optimizer* const> optimizers) override {
    if constexpr (!loom::needs_joint_setup<S>) throw std::logic_error("fabric_model: " + name_ + " sets modules up alone");
    else return std::make_unique<session>(backend().setup_module_jointly(module, optimizers));
  }
  optimizer_slot next_optimizer_slot(torch::optim::Optimizer& optimizer) override {
    return backend().next_optimizer_slot(optimizer);
  }
  void optimizer_step(torch::optim::Optimizer& optimizer, optimizer_slot slot) override {
    backend().stepper().step(optimizer, slot);
  }
  void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) override {
    backend().stepper().zero_grad(optimizer, set_to_none);
  }
  void unscale_gradients(torch::optim::Optimizer& optimizer, optimizer_slot slot) override {
    backend().unscale_gradients(optimizer, slot);
  }
  void backward(const at::Tensor& loss) override { backend().backward(loss); }

  void autocast(any_guard& guard) const override {
    guard.emplace_from([this] { return backend().autocast(); });
  }
  void init_context(any_guard& guard) const override {
    guard.emplace_from([this] { return backend().init_context(); });
  }
  void init_module_context(any_guard& guard, bool empty_init) const override {
    guard.emplace_from([this, empty_init] { return backend().init_module_context(empty_init); });
  }

  void barrier() override { backend().barrier(); }
  at::Tensor all_reduce(const at::Tensor& tensor, reduce_op op) override { return backend().all_reduce(tensor, op); }
  void all_reduce_(at::Tensor& tensor, reduce_op op) override { backend().all_reduce_(tensor, op); }
  at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads) override {
    return backend().all_gather(tensor, sync_grads);
  }
  std::vector<at::Tensor> all_gather_per_rank(const at::Tensor& tensor) override {
    return backend().all_gather_per_rank(tensor);
  }
  at::Tensor broadcast(const at::Tensor& tensor, int source) override { return backend().broadcast(tensor, source); }
  at::Tensor reduce_scatter(const at::Tensor& tensor, reduce_op op) override {
    return backend().reduce_scatter(tensor, op);
  }
  c10::IValue broadcast_object(const c10::IValue& value, int source) override {
    return backend().broadcast_object(value, source);
  }
  bool reduce_boolean_decision(bool decision, bool all) override {
    return backend().reduce_boolean_decision(decision, all);
  }

  void save(const std::string& path, const state& checkpoint, const state_filter& filter) override {
    backend().save(path, checkpoint, filter);
  }
  state load(const std::string& path, const state& checkpoint, bool strict) override {
    return backend().load(path, checkpoint, strict);
  }

 private:
  using backend_type = static_backend<A, S, P>;
  backend_type& backend() noexcept { return fabric_.backend(); }
  const backend_type& backend() const noexcept { return fabric_.backend(); }

  // The static session, erased: the forward-order rule stays wrapped_module's.
  class session final : public module_session {
   public:
    explicit session(typename backend_type::session_type bound) : module_session(P::converts_io), bound_(std::move(bound)) {}

    void forward(torch::nn::Module& module, function_ref<void()> run, output_ref output) override {
      (void)bound_.forward(module, [&] {
        run();
        return output;
      });
    }
    void forward_context(any_guard& guard) override {
      guard.emplace_from([this] { return bound_.forward_context(); });
    }
    at::Tensor convert_input(const at::Tensor& tensor) const override { return bound_.convert_input(tensor); }
    at::Tensor convert_output(const at::Tensor& tensor) const override { return bound_.convert_output(tensor); }
    std::optional<double> clip_gradients(torch::nn::Module& module, const clip_options& options) override {
      return bound_.clip_gradients(module, options);
    }
    // The facade refuses a strategy that cannot skip before it reaches here.
    void no_backward_sync(any_guard& guard, bool enabled) override {
      if constexpr (loom::supports_no_backward_sync<S>) {
        guard.emplace_from([&] { return bound_.no_backward_sync(enabled); });
      } else {
        throw std::logic_error("fabric_model: " + std::string(S::name) + " cannot skip gradient synchronisation");
      }
    }

   private:
    typename backend_type::session_type bound_;
  };

  std::string name_;
  fabric_type fabric_;
};

}  // namespace loom::runtime
