// loom::AnyFabric and loom::make_fabric: the Fabric API with the combination
// chosen from strings at run time (config files, command lines, loom-run's
// LT_* variables), among the combinations compiled once in libloom.
//
// Type erasure stops at this edge: each API call (setup, forward, backward,
// step, a collective) is one indirect call into the compiled Fabric<A, S, P>;
// the module's own forward and everything inside it run as written, and this
// header pulls in none of the strategies or precisions.
#pragma once

#include <loom/checkpoint/io.hpp>
#include <loom/compat.hpp>
#include <loom/fabric_options.hpp>
#include <loom/fabric_services.hpp>
#include <loom/launch/run_launched.hpp>
#include <loom/runtime/connector.hpp>
#include <loom/runtime/fabric_interface.hpp>
#include <loom/util/clip_gradients.hpp>
#include <loom/util/seed.hpp>
#include <loom/wrap/build_loader.hpp>
#include <loom/wrap/module.hpp>

#include <array>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

// make_fabric's arguments, Lightning Fabric's names and defaults (in this
// order, for designated initializers).
struct fabric_config {
  std::string accelerator = "auto";  // auto | cpu | cuda | gpu (mps, tpu: refused with the reason)
  std::string strategy = "auto";     // a registered name: auto, single_device, ddp, ddp_fork, ...
  // The strategy's options: a JSON object ("{\"bucket_cap_mb\": 50}") or the
  // path of a file holding one; each name lists its keys (docs/configuration.md).
  std::string strategy_options;
  devices_spec devices;              // not given: auto, or what an external launcher started
  runtime::precision_input precision;  // 64 | 32 | 16 | "bf16-mixed" | ...; not given: "32-true"
  int num_nodes = 1;
  std::vector<logger> loggers;
  std::vector<callback> callbacks;
};

// The module setup returns: the user's module, whose forward runs through the
// erased strategy and precision with one indirect call.
template <ModuleHolder Holder>
class any_module {
 public:
  using holder_type = Holder;
  using impl_type = module_impl_t<Holder>;

  any_module(Holder module, std::unique_ptr<runtime::module_session> session)
      : module_(std::move(module)), session_(std::move(session)) {}

  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  template <class... Args>
  auto forward(Args&&... args) {
    return run(detail::call_forward{}, std::forward<Args>(args)...);
  }

  // method(module, args...) run the way forward runs (see fabric_module::run).
  template <class Method, class... Args>
  auto run(Method&& method, Args&&... args) {
    impl_type& impl = *module_;
    runtime::module_session& session = *session_;
    if (!session.converts_io()) {
      using output_t = std::remove_cvref_t<std::invoke_result_t<Method&, impl_type&, Args&&...>>;
      std::optional<output_t> output;
      auto body = [&] { output.emplace(std::invoke(method, impl, std::forward<Args>(args)...)); };
      session.forward(impl, body, runtime::output_ref(output));
      return std::move(*output);
    } else {
      auto to_input = [&session](const at::Tensor& t) { return session.convert_input(t); };
      using output_t = std::remove_cvref_t<decltype(std::invoke(
          method, impl, apply_to_collection(std::forward<Args>(args), to_input)...))>;
      std::optional<output_t> output;
      auto body = [&] {
        output.emplace(std::invoke(method, impl, apply_to_collection(std::forward<Args>(args), to_input)...));
      };
      session.forward(impl, body, runtime::output_ref(output));
      for_each_tensor(*output, [&session](at::Tensor& t) { t = session.convert_output(t); });
      return std::move(*output);
    }
  }

  impl_type* operator->() noexcept { return &*module_; }
  const impl_type* operator->() const noexcept { return &*module_; }
  impl_type& operator*() noexcept { return *module_; }
  Holder& module() noexcept { return module_; }
  const Holder& module() const noexcept { return module_; }
  runtime::module_session& session() noexcept { return *session_; }

 private:
  Holder module_;
  std::unique_ptr<runtime::module_session> session_;
};

// The optimizer setup returns: step and zero_grad through the erased strategy
// and precision (one indirect call each).
template <class O>
  requires std::derived_from<O, torch::optim::Optimizer>
class any_optimizer {
 public:
  using optimizer_type = O;

  any_optimizer(O& optimizer, runtime::fabric_interface& fabric, optimizer_slot slot)
      : optimizer_(&optimizer), fabric_(&fabric), slot_(slot) {}

  void step() { fabric_->optimizer_step(*optimizer_, slot_); }
  void zero_grad() { fabric_->zero_grad(*optimizer_); }
  void zero_grad(bool set_to_none) { compat::zero_grad(*optimizer_, set_to_none); }

  O& optimizer() noexcept { return *optimizer_; }
  const O& optimizer() const noexcept { return *optimizer_; }
  O* operator->() noexcept { return optimizer_; }
  auto& param_groups() noexcept { return optimizer_->param_groups(); }
  optimizer_slot slot() const noexcept { return slot_; }

 private:
  O* optimizer_;
  runtime::fabric_interface* fabric_;
  optimizer_slot slot_;
};

class AnyFabric {
 public:
  // no_backward_sync compiles; supports_no_backward_sync() says at run time
  // whether the chosen strategy can skip synchronisation.
  static constexpr bool may_skip_backward_sync = true;

  // Usually made by make_fabric; here for combinations built by hand.
  AnyFabric(std::unique_ptr<runtime::fabric_interface> fabric, std::vector<logger> loggers,
            std::vector<callback> callbacks, std::vector<std::string> warnings = {})
      : fabric_(std::move(fabric)),
        services_(std::move(loggers), std::move(callbacks)),
        warnings_(std::move(warnings)) {}

  // What was chosen: "cpu", the registered strategy name, "bf16-mixed".
  std::string_view accelerator() const noexcept { return fabric_->accelerator_name(); }
  const std::string& strategy_name() const noexcept { return fabric_->registered_name(); }
  std::string_view precision() const noexcept { return fabric_->precision_name(); }
  // The connector's warnings (legacy spellings, fallbacks), already printed on rank zero.
  const std::vector<std::string>& warnings() const noexcept { return warnings_; }
  // The static Fabric inside, when it is a F (else nullptr): the way back to
  // the policies' own members (fabric.strategy(), ...).
  template <class F>
  F* target() noexcept {
    return static_cast<F*>(fabric_->fabric_if(typeid(F)));
  }
  runtime::fabric_interface& erased() noexcept { return *fabric_; }

  // ---------------------------------------------------------------- launch
  void launch() { fabric_->launch(); }
  template <class Function>
  decltype(auto) launch(Function&& function) {
    launch();
    return detail::run_launched(*this, std::forward<Function>(function), fabric_->is_forked_child());
  }

  // ----------------------------------------------------------------- setup
  template <ModuleHolder Holder, class... Optimizers>
  [[nodiscard("train through what setup returns")]]
  auto setup(Holder module, Optimizers&... optimizers) {
    if constexpr (sizeof...(Optimizers) > 0) {
      if (fabric_->needs_joint_setup()) {
        const std::array<torch::optim::Optimizer*, sizeof...(Optimizers)> all{&optimizers...};
        auto session = fabric_->setup_module_jointly(*module, all);
        return std::tuple<any_module<Holder>, any_optimizer<Optimizers>...>(
            any_module<Holder>(std::move(module), std::move(session)), wrap_optimizer(optimizers)...);
      }
    }
    auto wrapped = setup_module(std::move(module));
    if constexpr (sizeof...(Optimizers) == 0) {
      return wrapped;
    } else {
      return std::tuple<any_module<Holder>, any_optimizer<Optimizers>...>(std::move(wrapped),
                                                                          wrap_optimizer(optimizers)...);
    }
  }
  template <ModuleHolder Holder>
  [[nodiscard]] any_module<Holder> setup_module(Holder module, bool move_to_device = true) {
    auto session = fabric_->setup_module(*module, move_to_device);
    return any_module<Holder>(std::move(module), std::move(session));
  }
  template <class... Optimizers>
    requires(sizeof...(Optimizers) > 0)
  [[nodiscard]] auto setup_optimizers(Optimizers&... optimizers) {
    if (fabric_->needs_joint_setup()) {
      throw configuration_error("setup_optimizers: strategy '" + strategy_name() +
                                "' sets up the module and its optimizers together; call "
                                "fabric.setup(module, optimizer...) instead.");
    }
    if constexpr (sizeof...(Optimizers) == 1) return wrap_optimizer(optimizers...);
    else return std::tuple<any_optimizer<Optimizers>...>(wrap_optimizer(optimizers)...);
  }
  template <class Dataset>
  [[nodiscard]] auto setup_dataloaders(Dataset dataset, const loader_options& options) {
    return detail::build_loader(std::move(dataset), options, world_size(), global_rank(), device());
  }
  template <class Loader>
  [[nodiscard]] auto setup_dataloaders(std::unique_ptr<Loader> loader, bool move_to_device = true) {
    if (fabric_->needs_distributed_sampler()) {
      throw configuration_error("setup_dataloaders(loader): strategy '" + strategy_name() +
                                "' shards data with a distributed sampler, which loom can insert only into a loader "
                                "it builds. Pass the dataset and loom::loader_options instead.");
    }
    return fabric_dataloader<Loader>(std::move(loader), device(), move_to_device, nullptr, std::nullopt);
  }

  // -------------------------------------------------------------- training
  void backward(const at::Tensor& loss) { fabric_->backward(loss); }

  template <class Holder, class O>
  std::optional<double> clip_gradients(any_module<Holder>& module, any_optimizer<O>& optimizer,
                                       const clip_options& options) {
    detail::check_clip_options(options);
    fabric_->unscale_gradients(optimizer.optimizer(), optimizer.slot());
    return module.session().clip_gradients(*module, options);
  }

  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]

  any_guard autocast() const {
    return any_guard([this](any_guard& guard) { fabric_->autocast(guard); });
  }
  // Whether no_backward_sync can be used with this strategy.
  bool supports_no_backward_sync() const noexcept { return fabric_->supports_no_backward_sync(); }
  // Throws where the strategy cannot skip gradient synchronisation (the
  // static Fabric refuses that at compile time).
  template <class Holder>
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  any_guard no_backward_sync(any_module<Holder>& module, bool enabled = true) {
    return any_guard([&](any_guard& guard) { module.session().no_backward_sync(guard, enabled); });
  }
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  any_guard init_tensor() const {
    return any_guard([this](any_guard& guard) { fabric_->init_context(guard); });
  }
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  any_guard init_module(bool /*empty_init*/ = false) const { return init_tensor(); }

  template <class T>
  auto to_device(T&& value) const {
    const c10::Device target_device = device();
    if constexpr (ModuleHolder<T>) {
      value->to(target_device);
      return std::forward<T>(value);
    } else {
      return apply_to_collection(std::forward<T>(value),
                                 [&target_device](const at::Tensor& t) { return detail::move_tensor(t, target_device); });
    }
  }

  std::uint64_t seed_everything(std::optional<std::uint64_t> seed = std::nullopt) {
    return loom::seed_everything(seed);
  }

  // ---------------------------------------------------------- processes
  int global_rank() const noexcept { return fabric_->global_rank(); }
  int local_rank() const noexcept { return fabric_->local_rank(); }
  int node_rank() const noexcept { return fabric_->node_rank(); }
  int world_size() const noexcept { return fabric_->world_size(); }
  bool is_global_zero() const noexcept { return global_rank() == 0; }
  c10::Device device() const noexcept { return fabric_->device(); }
  void barrier() { fabric_->barrier(); }

  template <class... Args>
  void print(const Args&... args) const {
    detail::print_on_zero(is_global_zero(), args...);
  }
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto rank_zero_first() { return detail::rank_zero_first_guard<AnyFabric>(*this); }

  // ---------------------------------------------------------- collectives
  // As Fabric's: a tensor or a nested container of tensors; one indirect call per tensor.
  template <class T>
  auto all_reduce(T&& value, reduce_op op = reduce_op::sum) {
    return apply_to_collection(std::forward<T>(value),
                               [this, op](const at::Tensor& t) { return fabric_->all_reduce(t, op); });
  }
  void all_reduce_(at::Tensor& tensor, reduce_op op = reduce_op::sum) { fabric_->all_reduce_(tensor, op); }
  template <class T>
  auto all_gather(T&& value, bool sync_grads = false) {
    return apply_to_collection(std::forward<T>(value), [this, sync_grads](const at::Tensor& t) {
      return fabric_->all_gather(t, sync_grads);
    });
  }
  template <class T>
  auto all_gather_per_rank(T&& value) {
    return apply_to_collection(std::forward<T>(value),
                               [this](const at::Tensor& t) { return fabric_->all_gather_per_rank(t); });
  }
  template <class T>
  auto broadcast(T&& value, int source = 0) {
    return apply_to_collection(std::forward<T>(value),
                               [this, source](const at::Tensor& t) { return fabric_->broadcast(t, source); });
  }
  template <class T>
  auto reduce_scatter(T&& value, reduce_op op = reduce_op::sum) {
    return apply_to_collection(std::forward<T>(value),
                               [this, op](const at::Tensor& t) { return fabric_->reduce_scatter(t, op); });
  }
  c10::IValue broadcast_object(const c10::IValue& value, int source = 0) {
    return fabric_->broadcast_object(value, source);
  }
  template <class T>
    requires(!std::is_same_v<std::remove_cvref_t<T>, c10::IValue>)
  T broadcast_object(const T& value, int source = 0) {
    return fabric_->broadcast_object(c10::IValue(value), source).template to<T>();
  }
  bool reduce_boolean_decision(bool decision, bool all = true) {
    return fabric_->reduce_boolean_decision(decision, all);
  }

  // ------------------------------------------------------ loggers, hooks
  template <class Value>
  void log(const std::string& name, const Value& value, std::optional<std::int64_t> step = std::nullopt) {
    services_.log(is_global_zero(), name, value, step);
  }
  void log_dict(const metrics& values, std::optional<std::int64_t> step = std::nullopt) {
    services_.log_dict(is_global_zero(), values, step);
  }
  std::vector<logger>& loggers() noexcept { return services_.loggers(); }
  logger& first_logger() { return services_.first_logger(); }
  void add_callback(callback entry) { services_.add_callback(std::move(entry)); }
  const std::vector<callback>& callbacks() const noexcept { return services_.callbacks(); }
  template <class Hook, class... Args>
  void call(Args&&... args) {
    services_.template call<Hook>(std::forward<Args>(args)...);
  }

  // --------------------------------------------------------- checkpoints
  void save(const std::string& path, const state& checkpoint, const state_filter& filter = {}) {
    fabric_->save(path, checkpoint, filter);
  }
  state load(const std::string& path, const state& checkpoint, bool strict = true) {
    return fabric_->load(path, checkpoint, strict);
  }
  template <class Target>
  void load_raw(const std::string& path, Target& target, bool strict = true) {
    if constexpr (ModuleHolder<Target> || requires { target.module(); }) {
      load_raw_module(path, *target, strict);
    } else if constexpr (requires { target.optimizer(); }) {
      load_raw_optimizer(path, target.optimizer());
    } else {
      static_assert(std::is_base_of_v<torch::optim::Optimizer, Target>,
                    "loom::AnyFabric::load_raw(path, target): target must be a module or an optimizer.");
      load_raw_optimizer(path, target);
    }
  }

 private:
  template <class O>
  any_optimizer<O> wrap_optimizer(O& optimizer) {
    return any_optimizer<O>(optimizer, *fabric_, fabric_->setup_optimizer(optimizer));
  }

  std::unique_ptr<runtime::fabric_interface> fabric_;
  detail::fabric_services services_;
  std::vector<std::string> warnings_;
};

// Resolves config with Lightning's connector rules (and loom-run's LT_*
// values), then builds the registered combination. Unknown names, conflicts
// and combinations this build cannot run are loom::configuration_error
// naming what was asked and what is accepted.
AnyFabric make_fabric(fabric_config config = {});

}  // namespace loom
