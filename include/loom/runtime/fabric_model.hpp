// fabric_interface implemented by a static Fabric<A, S, P>: every member is
// the static Fabric's own code, reached through one virtual call. The
// registry instantiates it once per combination in src/; a user who
// registers a strategy of their own instantiates it in their TU.
#pragma once

#include <loom/fabric.hpp>
#include <loom/runtime/fabric_interface.hpp>

#include <memory>
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

  void launch() override { fabric_.launch(); }
  bool is_forked_child() const noexcept override {
    if constexpr (requires(const S& s) { s.is_forked_child(); }) return strategy().is_forked_child();
    else return false;
  }
  int global_rank() const noexcept override { return fabric_.global_rank(); }
  int local_rank() const noexcept override { return fabric_.local_rank(); }
  int node_rank() const noexcept override { return fabric_.node_rank(); }
  int world_size() const noexcept override { return fabric_.world_size(); }
  c10::Device device() const noexcept override { return fabric_.device(); }
  bool needs_distributed_sampler() const noexcept override { return loom::needs_distributed_sampler<S>; }
  bool supports_no_backward_sync() const noexcept override { return loom::supports_no_backward_sync<S>; }
  bool needs_joint_setup() const noexcept override { return loom::needs_joint_setup<S>; }

  std::unique_ptr<module_session> setup_module(torch::nn::Module& module, bool move_to_device) override {
    if constexpr (loom::needs_joint_setup<S>) {
      throw configuration_error("setup_module: strategy '" + name_ +
                                "' sets up the module and its optimizers together; call "
                                "fabric.setup(module, optimizer...) instead.");
    } else {
      return std::make_unique<session>(fabric_, fabric_.setup_module_state(module, move_to_device));
    }
  }
  std::unique_ptr<module_session> setup_module_jointly(torch::nn::Module& module,
                                                       std::span<torch::optim::Optimizer* const> optimizers) override {
    if constexpr (loom::needs_joint_setup<S>) {
      return std::make_unique<session>(fabric_, fabric_.setup_module_state_jointly(module, optimizers));
    } else {
      throw std::logic_error("setup_module_jointly: strategy '" + name_ + "' sets modules up alone");
    }
  }
  optimizer_slot setup_optimizer(torch::optim::Optimizer& /*optimizer*/) override {
    return fabric_.next_optimizer_slot();
  }
  void optimizer_step(torch::optim::Optimizer& optimizer, optimizer_slot slot) override {
    fabric_.strategy().optimizer_step(fabric_.precision(), optimizer, slot);
  }
  void zero_grad(torch::optim::Optimizer& optimizer) override { fabric_.strategy().zero_grad(optimizer); }
  void unscale_gradients(torch::optim::Optimizer& optimizer, optimizer_slot slot) override {
    fabric_.precision().unscale_gradients(optimizer, slot);
  }
  void backward(const at::Tensor& loss) override { fabric_.backward(loss); }

  void autocast(any_guard& guard) const override {
    guard.emplace_from([this] { return fabric_.autocast(); });
  }
  void init_context(any_guard& guard) const override {
    guard.emplace_from([this] { return fabric_.init_tensor(); });
  }

  void barrier() override { fabric_.barrier(); }
  at::Tensor all_reduce(const at::Tensor& tensor, reduce_op op) override { return fabric_.all_reduce(tensor, op); }
  void all_reduce_(at::Tensor& tensor, reduce_op op) override { fabric_.all_reduce_(tensor, op); }
  at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads) override {
    return fabric_.all_gather(tensor, sync_grads);
  }
  std::vector<at::Tensor> all_gather_per_rank(const at::Tensor& tensor) override {
    return fabric_.all_gather_per_rank(tensor);
  }
  at::Tensor broadcast(const at::Tensor& tensor, int source) override { return fabric_.broadcast(tensor, source); }
  at::Tensor reduce_scatter(const at::Tensor& tensor, reduce_op op) override {
    return fabric_.reduce_scatter(tensor, op);
  }
  c10::IValue broadcast_object(const c10::IValue& value, int source) override {
    return fabric_.broadcast_object(value, source);
  }
  bool reduce_boolean_decision(bool decision, bool all) override {
    return fabric_.reduce_boolean_decision(decision, all);
  }

  void save(const std::string& path, const state& checkpoint, const state_filter& filter) override {
    fabric_.save(path, checkpoint, filter);
  }
  state load(const std::string& path, const state& checkpoint, bool strict) override {
    return fabric_.load(path, checkpoint, strict);
  }

 private:
  const S& strategy() const noexcept { return const_cast<fabric_type&>(fabric_).strategy(); }

  class session final : public module_session {
   public:
    session(fabric_type& fabric, typename S::module_state state)
        : module_session(P::converts_io), fabric_(&fabric), state_(std::move(state)) {}

    void forward(torch::nn::Module& module, function_ref<void()> run, output_ref output) override {
      // The same order as fabric_module::forward: the context spans the
      // strategy's forward; outputs are converted by the caller after it.
      auto body = [&] {
        (void)fabric_->strategy().forward(state_, module, [&] {
          run();
          return output;
        });
      };
      if constexpr (P::converts_io) {
        auto context = fabric_->precision().forward_context(A::device_type);
        body();
      } else {
        body();
      }
    }
    std::optional<double> clip_gradients(torch::nn::Module& module, const clip_options& options) override {
      return fabric_->strategy().clip_gradients(state_, module, options);
    }
    at::Tensor convert_input(const at::Tensor& tensor) const override {
      return fabric_->precision().convert_input(tensor);
    }
    at::Tensor convert_output(const at::Tensor& tensor) const override {
      return fabric_->precision().convert_output(tensor);
    }
    void no_backward_sync(any_guard& guard, bool enabled) override {
      if constexpr (loom::supports_no_backward_sync<S>) {
        guard.emplace_from([&] { return fabric_->strategy().no_backward_sync(state_, enabled); });
      } else {
        throw configuration_error("no_backward_sync: strategy '" + std::string(S::name) +
                                  "' cannot skip gradient synchronisation. Use ddp or single_device, or accumulate "
                                  "without it.");
      }
    }

   private:
    fabric_type* fabric_;
    typename S::module_state state_;
  };

  std::string name_;
  fabric_type fabric_;
};

}  // namespace loom::runtime
