// The type-erased face of one compiled Fabric<A, S, P>: what AnyFabric calls,
// one indirect call per API call (setup, forward, backward, step,
// collective), never per tensor operation inside the module. Implemented
// once per combination by runtime/fabric_model.hpp, compiled in src/.
#pragma once

#include <loom/checkpoint/state.hpp>
#include <loom/comm/reduce_op.hpp>
#include <loom/concepts/base.hpp>
#include <loom/runtime/any_guard.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/function_ref.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

namespace loom {

struct clip_options;

namespace runtime {

// A forward's output as the erased strategy sees it: it can visit the
// tensors (DDP finds unused parameters from them) and replace them (DDP's
// static-graph sink). Two pointers; the output itself stays on the caller's
// stack with its own type.
class output_ref {
 public:
  using loom_tensor_view = void;
  using map_function = function_ref<at::Tensor(const at::Tensor&)>;
  using visit_function = function_ref<void(const at::Tensor&)>;

  template <class Out>
  explicit output_ref(Out& output) noexcept
      : object_(&output),
        map_([](void* object, map_function function) {
          for_each_tensor(*static_cast<Out*>(object), [&function](at::Tensor& t) { t = function(t); });
        }),
        visit_([](void* object, visit_function function) {
          for_each_tensor(*static_cast<Out*>(object), [&function](at::Tensor& t) { function(t); });
        }) {}

  template <class F>
  void map(F&& function) const {
    map_(object_, map_function([&function](const at::Tensor& t) -> at::Tensor { return function(t); }));
  }
  template <class F>
  void for_each(F&& function) const {
    visit_(object_, visit_function([&function](const at::Tensor& t) { function(t); }));
  }

 private:
  void* object_;
  void (*map_)(void*, map_function);
  void (*visit_)(void*, visit_function);
};

// What the strategy and precision keep for one set-up module.
class module_session {
 public:
  explicit module_session(bool converts_io) noexcept : converts_io_(converts_io) {}
  virtual ~module_session() = default;
  module_session(const module_session&) = delete;
  module_session& operator=(const module_session&) = delete;

  // Runs run() (the module's own forward, which writes its result to the
  // object output refers to) inside the strategy's forward (its preparation
  // for backward). The precision's part is wrapped_module's (wrap/module.hpp).
  virtual void forward(torch::nn::Module& module, function_ref<void()> run, output_ref output) = 0;
  // The precision's forward context, emplaced in guard.
  virtual void forward_context(any_guard& guard) = 0;
  virtual at::Tensor convert_input(const at::Tensor& tensor) const = 0;
  virtual at::Tensor convert_output(const at::Tensor& tensor) const = 0;
  virtual void no_backward_sync(any_guard& guard, bool enabled) = 0;
  // Through the strategy: the norm over the whole model across ranks.
  virtual std::optional<double> clip_gradients(torch::nn::Module& module, const clip_options& options) = 0;
  // Whether inputs and outputs are converted (the "-true" and mixed precisions).
  bool converts_io() const noexcept { return converts_io_; }

 private:
  bool converts_io_;
};

class fabric_interface {
 public:
  virtual ~fabric_interface() = default;
  fabric_interface() = default;
  fabric_interface(const fabric_interface&) = delete;
  fabric_interface& operator=(const fabric_interface&) = delete;

  // The policies' names ("cpu", "ddp", "bf16-mixed") and the registered name
  // this was built from ("ddp_find_unused_parameters_true").
  virtual std::string_view accelerator_name() const noexcept = 0;
  virtual std::string_view strategy_name() const noexcept = 0;
  virtual std::string_view precision_name() const noexcept = 0;
  virtual const std::string& registered_name() const noexcept = 0;
  // The Fabric<A, S, P> inside when its type is `type`, else nullptr.
  virtual void* fabric_if(const std::type_info& type) noexcept = 0;

  virtual void launch() = 0;
  virtual bool is_forked_child() const noexcept = 0;
  virtual int global_rank() const noexcept = 0;
  virtual int local_rank() const noexcept = 0;
  virtual int node_rank() const noexcept = 0;
  virtual int world_size() const noexcept = 0;
  virtual int sampler_replicas() = 0;
  virtual int sampler_rank() = 0;
  virtual c10::Device device() const noexcept = 0;
  virtual bool needs_distributed_sampler() const noexcept = 0;
  virtual bool supports_no_backward_sync() const noexcept = 0;
  virtual bool needs_joint_setup() const noexcept = 0;

  virtual std::unique_ptr<module_session> setup_module(torch::nn::Module& module, bool move_to_device) = 0;
  // A strategy that needs_joint_setup: the module with all its optimizers.
  virtual std::unique_ptr<module_session> setup_module_jointly(torch::nn::Module& module,
                                                               std::span<torch::optim::Optimizer* const> optimizers) = 0;
  // A new optimizer slot (the grad scaler keeps per-optimizer state by slot).
  virtual optimizer_slot next_optimizer_slot(torch::optim::Optimizer& optimizer) = 0;
  virtual void optimizer_step(torch::optim::Optimizer& optimizer, optimizer_slot slot) = 0;
  virtual void zero_grad(torch::optim::Optimizer& optimizer, bool set_to_none) = 0;
  virtual void unscale_gradients(torch::optim::Optimizer& optimizer, optimizer_slot slot) = 0;
  virtual void backward(const at::Tensor& loss) = 0;

  virtual void autocast(any_guard& guard) const = 0;
  virtual void init_context(any_guard& guard) const = 0;
  virtual void init_module_context(any_guard& guard, bool empty_init) const = 0;

  virtual void barrier() = 0;
  virtual at::Tensor all_reduce(const at::Tensor& tensor, reduce_op op) = 0;
  virtual void all_reduce_(at::Tensor& tensor, reduce_op op) = 0;
  virtual at::Tensor all_gather(const at::Tensor& tensor, bool sync_grads) = 0;
  virtual std::vector<at::Tensor> all_gather_per_rank(const at::Tensor& tensor) = 0;
  virtual at::Tensor broadcast(const at::Tensor& tensor, int source) = 0;
  virtual at::Tensor reduce_scatter(const at::Tensor& tensor, reduce_op op) = 0;
  virtual c10::IValue broadcast_object(const c10::IValue& value, int source) = 0;
  virtual bool reduce_boolean_decision(bool decision, bool all) = 0;

  virtual void save(const std::string& path, const state& checkpoint, const state_filter& filter) = 0;
  virtual state load(const std::string& path, const state& checkpoint, bool strict) = 0;
};

}  // namespace runtime
}  // namespace loom
