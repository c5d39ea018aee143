// loom::Fabric<Accelerator, Strategy, Precision>: Lightning Fabric's API with
// the three policies as types. Orchestration only: every decision lives in a
// policy, and the per-step path (forward, backward, step, collectives) is
// resolved by the compiler.
#pragma once

#include <loom/accelerator/cpu.hpp>
#include <loom/callbacks/callback.hpp>
#include <loom/checkpoint/io.hpp>
#include <loom/cluster/launcher_agreement.hpp>
#include <loom/checkpoint/state.hpp>
#include <loom/compatibility.hpp>
#include <loom/concepts.hpp>
#include <loom/devices.hpp>
#include <loom/errors.hpp>
#include <loom/fabric_options.hpp>
#include <loom/fabric_services.hpp>
#include <loom/launch/run_launched.hpp>
#include <loom/loggers/logger.hpp>
#include <loom/precision/true_precision.hpp>
#include <loom/strategy/single_device.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/clip_gradients.hpp>
#include <loom/util/seed.hpp>
#include <loom/wrap/build_loader.hpp>
#include <loom/wrap/dataloader.hpp>
#include <loom/wrap/module.hpp>
#include <loom/wrap/optimizer.hpp>


#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <array>
#include <span>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

namespace detail {
template <class A, class S, class P>
constexpr bool diagnose_fabric() {
  if constexpr (!diagnose_accelerator<A>()) return false;
  else if constexpr (!diagnose_strategy<S>()) return false;
  else if constexpr (!diagnose_precision<P>()) return false;
  else return diagnose_combination<A, S, P>();
}

}  // namespace detail

template <class A, class S = single_device, class P = fp32>
class Fabric {
  static_assert(detail::diagnose_fabric<A, S, P>());

 public:
  using accelerator_type = A;
  using strategy_type = S;
  using precision_type = P;
  // Whether no_backward_sync compiles for this type (then
  // supports_no_backward_sync() is true); AnyFabric decides at run time.
  static constexpr bool may_skip_backward_sync = loom::supports_no_backward_sync<S>;
  template <class Holder>
  using module_type = fabric_module<Holder, S, P, A::device_type>;
  template <class O>
  using optimizer_type = fabric_optimizer<O, S, P>;

  explicit Fabric(fabric_options options = {}, S strategy = {}, P precision = {})
      : strategy_(std::move(strategy)),
        precision_(std::move(precision)),
        services_(std::move(options.loggers), std::move(options.callbacks)) {
    if (options.num_nodes < 1) {
      throw configuration_error("num_nodes=" + std::to_string(options.num_nodes) + " is not valid: it must be >= 1");
    }
    // Started by loom-run: its --accelerator/--strategy/--precision/--devices must agree with this type.
    if (!options.checked_by_connector) {
      const std::string conflict = cluster::launcher_conflict(
          A::name, S::name, P::name,
          options.devices.given() ? std::optional<std::string>(options.devices.text()) : std::nullopt,
          options.num_nodes, options.num_nodes != 1);
      if (!conflict.empty()) throw configuration_error(conflict);
    }
    strategy_environment environment;
    environment.requested = options.devices;
    environment.parse_devices = &A::parse_devices;
    environment.device_of = &A::device;
    environment.accelerator = A::name;
    environment.strategy = S::name;
    environment.num_nodes = options.num_nodes;
    strategy_.setup_environment(environment);
  }

  // Wrappers returned by setup point into this object.
  Fabric(const Fabric&) = delete;
  Fabric& operator=(const Fabric&) = delete;
  Fabric(Fabric&&) = delete;
  Fabric& operator=(Fabric&&) = delete;

  // ---------------------------------------------------------------- launch
  // Starts the other processes of the strategy; with one process there are none.
  // Starts the strategy's processes: a no-op with one process, or when the
  // program was started by loom-run, torchrun, srun or mpirun (where Lightning
  // raises; loom lets one program run under every launcher).
  void launch() {
    if constexpr (requires { strategy_.launch(); }) strategy_.launch();
  }
  // Runs fn(fabric) on every process of the strategy. Under the fork launcher
  // the forked processes end when fn returns (status 0, or 1 if it threw).
  template <class Function>
  decltype(auto) launch(Function&& function) {
    launch();
    bool forked_child = false;
    if constexpr (requires { strategy_.is_forked_child(); }) forked_child = strategy_.is_forked_child();
    return detail::run_launched(*this, std::forward<Function>(function), forked_child);
  }

  // ----------------------------------------------------------------- setup
  // The module converted to the precision and moved to the device, and each
  // optimizer wired to step through the strategy and precision. Returns the
  // module alone when no optimizer is given, else a tuple. A strategy that
  // needs_joint_setup (ZeRO) sets the module up together with its optimizers.
  template <ModuleHolder Holder, class... Optimizers>
  [[nodiscard("train through what setup returns")]]
  auto setup(Holder module, Optimizers&... optimizers) {
    if constexpr (needs_joint_setup<S>) {
      static_assert(sizeof...(Optimizers) > 0,
                    "loom::Fabric::setup: this strategy sets up the module and its optimizers together; pass them "
                    "all: fabric.setup(module, optimizer...).");
      const std::array<torch::optim::Optimizer*, sizeof...(Optimizers)> all{&optimizers...};
      typename S::module_state state = setup_module_state_jointly(*module, all);
      return std::tuple<module_type<Holder>, optimizer_type<Optimizers>...>(
          module_type<Holder>(std::move(module), strategy_, precision_, std::move(state)), wrap_optimizer(optimizers)...);
    } else {
      auto wrapped = setup_module(std::move(module));
      if constexpr (sizeof...(Optimizers) == 0) {
        return wrapped;
      } else {
        return std::tuple<module_type<Holder>, optimizer_type<Optimizers>...>(std::move(wrapped),
                                                                              wrap_optimizer(optimizers)...);
      }
    }
  }

  template <ModuleHolder Holder>
  [[nodiscard]] module_type<Holder> setup_module(Holder module, bool move_to_device = true) {
    static_assert(!needs_joint_setup<S>,
                  "loom::Fabric::setup_module: this strategy sets up the module and its optimizers together; call "
                  "fabric.setup(module, optimizer...) instead.");
    typename S::module_state state = setup_module_state(*module, move_to_device);
    return module_type<Holder>(std::move(module), strategy_, precision_, std::move(state));
  }

  // What setup_module does to the module itself (precision, device, the
  // strategy's per-module state), for wrappers other than fabric_module.
  typename S::module_state setup_module_state(torch::nn::Module& module, bool move_to_device = true) {
    static_assert(!needs_joint_setup<S>,
                  "loom::Fabric::setup_module_state: this strategy sets up the module and its optimizers together; "
                  "use setup_module_state_jointly.");
    precision_.convert_module(module);
    return strategy_.setup_module(module, move_to_device);
  }

  // What setup does to the module and optimizers of a needs_joint_setup
  // strategy, for wrappers other than fabric_module (AnyFabric's).
  typename S::module_state setup_module_state_jointly(torch::nn::Module& module,
                                                      std::span<torch::optim::Optimizer* const> optimizers) {
    static_assert(needs_joint_setup<S>,
                  "loom::Fabric::setup_module_state_jointly: this strategy sets modules up alone; use "
                  "setup_module_state.");
    precision_.convert_module(module);
    return strategy_.setup_module_and_optimizers(module, optimizers, /*move_to_device=*/true);
  }

  // The slot of the next optimizer set up (the precision keeps per-optimizer
  // state by slot), for wrappers other than fabric_optimizer.
  optimizer_slot next_optimizer_slot() noexcept { return optimizer_slot{next_optimizer_slot_++}; }

  template <class... Optimizers>
    requires(sizeof...(Optimizers) > 0)
  [[nodiscard]] auto setup_optimizers(Optimizers&... optimizers) {
    static_assert(!needs_joint_setup<S>,
                  "loom::Fabric::setup_optimizers: this strategy sets up the module and its optimizers together; "
                  "call fabric.setup(module, optimizer...) instead.");
    if constexpr (sizeof...(Optimizers) == 1) return wrap_optimizer(optimizers...);
    else return std::tuple<optimizer_type<Optimizers>...>(wrap_optimizer(optimizers)...);
  }

  // Builds a LibTorch loader over dataset (a torch::data dataset: per-example,
  // whose examples are stacked, or batch-producing such as
  // loom::data::tensor_dataset), with the strategy's sampler; batches arrive
  // on the device.
  template <class Dataset>
  [[nodiscard]] auto setup_dataloaders(Dataset dataset, const loader_options& options) {
    return detail::build_loader(std::move(dataset), options, strategy_.world_size(), strategy_.global_rank(),
                                strategy_.root_device());
  }

  // A loader the user built: batches are moved to the device, nothing else.
  template <class Loader>
  [[nodiscard]] auto setup_dataloaders(std::unique_ptr<Loader> loader, bool move_to_device = true) {
    static_assert(!needs_distributed_sampler<S>,
                  "loom::Fabric::setup_dataloaders(loader): this strategy shards data with a distributed sampler, "
                  "which loom can insert only into a loader it builds. Pass the dataset and loom::loader_options "
                  "instead.");
    return fabric_dataloader<Loader>(std::move(loader), strategy_.root_device(), move_to_device, nullptr,
                                     std::nullopt);
  }

  // -------------------------------------------------------------- training
  // Through the strategy (an engine may own backward), which asks the
  // precision to scale the loss.
  void backward(const at::Tensor& loss) { strategy_.backward(precision_, loss); }

  // Unscales the gradients first (16-mixed), then clips by norm or by value
  // through the strategy (a sharded one reduces the norm over its shards).
  // Returns the total norm of the whole model when clipping by norm.
  template <class Module, class Optimizer>
  std::optional<double> clip_gradients(Module& module, Optimizer& optimizer, const clip_options& options) {
    static_assert(is_fabric_module<Module> && is_fabric_optimizer<Optimizer>,
                  "loom::Fabric::clip_gradients(module, optimizer, options): pass the module and optimizer that "
                  "fabric.setup returned.");
    detail::check_clip_options(options);
    precision_.unscale_gradients(optimizer.optimizer(), optimizer.slot());
    return strategy_.clip_gradients(module.strategy_state(), *module, options);
  }

  // The precision's forward context, for code outside the wrapped forward.
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto autocast() const { return precision_.forward_context(A::device_type); }

  // Under DDP, skips gradient synchronisation for the backward passes inside
  // the guard's lifetime. A compile error where the strategy cannot skip it.
  template <class Module>
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto no_backward_sync(Module& module, bool enabled = true) {
    static_assert(loom::supports_no_backward_sync<S>,
                  "loom::Fabric::no_backward_sync: this strategy cannot skip gradient synchronisation (it has no "
                  "`supports_no_backward_sync`). Use it with loom::ddp or loom::single_device, or accumulate "
                  "without it.");
    static_assert(is_fabric_module<Module>,
                  "loom::Fabric::no_backward_sync(module): pass the module that fabric.setup returned.");
    return strategy_.no_backward_sync(module.strategy_state(), enabled);
  }

  // Tensors (or containers of them) moved to the device.
  template <class T>
  auto to_device(T&& value) const {
    if constexpr (ModuleHolder<T>) {
      value->to(strategy_.root_device());
      return std::forward<T>(value);
    } else {
      const c10::Device device = strategy_.root_device();
      return apply_to_collection(std::forward<T>(value),
                                 [&device](const at::Tensor& t) { return detail::move_tensor(t, device); });
    }
  }

  // While alive, new tensors and modules get the precision's dtype. LibTorch
  // 1.13 has no default device: modules are moved at setup.
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto init_tensor() const { return precision_.init_context(); }
  // empty_init is accepted for Lightning parity; it has no effect until a
  // sharded strategy can skip the initialisation.
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto init_module(bool /*empty_init*/ = false) const { return precision_.init_context(); }

  std::uint64_t seed_everything(std::optional<std::uint64_t> seed = std::nullopt) {
    return loom::seed_everything(seed);
  }

  // ---------------------------------------------------------- processes
  int global_rank() const { return strategy_.global_rank(); }
  int local_rank() const { return strategy_.local_rank(); }
  int node_rank() const { return strategy_.node_rank(); }
  int world_size() const { return strategy_.world_size(); }
  bool is_global_zero() const { return strategy_.global_rank() == 0; }
  c10::Device device() const { return strategy_.root_device(); }
  S& strategy() noexcept { return strategy_; }
  P& precision() noexcept { return precision_; }

  void barrier() { strategy_.barrier(); }

  // Whether no_backward_sync can be used with this strategy (AnyFabric's
  // question, answered at compile time here).
  static constexpr bool supports_no_backward_sync() noexcept { return loom::supports_no_backward_sync<S>; }

  // Prints its arguments, separated by spaces, on global rank zero.
  template <class... Args>
  void print(const Args&... args) const {
    detail::print_on_zero(is_global_zero(), args...);
  }

  // Rank zero runs the guarded block first, the others wait for it (e.g. to
  // download or preprocess once).
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto rank_zero_first() { return detail::rank_zero_first_guard<Fabric>(*this); }

  // ---------------------------------------------------------- collectives
  // Each takes a tensor or a nested container of tensors and returns a value
  // of the same shape; the inputs are not modified. On one process they are
  // identities, resolved at compile time.
  template <class T>
  auto all_reduce(T&& value, reduce_op op = reduce_op::sum) {
    return strategy_.all_reduce(std::forward<T>(value), op);
  }
  // In place, without a copy (the hot-path form).
  void all_reduce_(at::Tensor& tensor, reduce_op op = reduce_op::sum) { strategy_.all_reduce_(tensor, op); }
  // Lightning's all_gather: each tensor becomes [world_size, ...] (equal
  // shapes), or stays as it is on one process (no added dimension, as
  // Lightning); with sync_grads the result keeps autograd across ranks.
  template <class T>
  auto all_gather(T&& value, bool sync_grads = false) {
    return strategy_.all_gather(std::forward<T>(value), sync_grads);
  }
  // Each tensor becomes a std::vector with one tensor per rank; shapes may differ across ranks.
  template <class T>
  auto all_gather_per_rank(T&& value) {
    return strategy_.all_gather_per_rank(std::forward<T>(value));
  }
  template <class T>
  auto broadcast(T&& value, int source = 0) {
    return strategy_.broadcast(std::forward<T>(value), source);
  }
  // Each tensor's first dimension is world_size * n; every rank gets its n rows of the reduction.
  template <class T>
  auto reduce_scatter(T&& value, reduce_op op = reduce_op::sum) {
    return strategy_.reduce_scatter(std::forward<T>(value), op);
  }
  // Numbers, strings, lists, dicts, tensors (anything c10::IValue holds), through LibTorch's pickler.
  c10::IValue broadcast_object(const c10::IValue& value, int source = 0) {
    return strategy_.broadcast_object(value, source);
  }
  template <class T>
    requires(!std::is_same_v<std::remove_cvref_t<T>, c10::IValue>)
  T broadcast_object(const T& value, int source = 0) {
    return strategy_.broadcast_object(c10::IValue(value), source).template to<T>();
  }
  bool reduce_boolean_decision(bool decision, bool all = true) {
    return strategy_.reduce_boolean_decision(decision, all);
  }

  // ------------------------------------------------------ loggers, hooks
  // To every logger, on global rank zero.
  template <class Value>
  void log(const std::string& name, const Value& value, std::optional<std::int64_t> step = std::nullopt) {
    services_.log(is_global_zero(), name, value, step);
  }
  void log_dict(const metrics& values, std::optional<std::int64_t> step = std::nullopt) {
    services_.log_dict(is_global_zero(), values, step);
  }
  std::vector<logger>& loggers() noexcept { return services_.loggers(); }
  // The first logger (Lightning's fabric.logger).
  logger& first_logger() { return services_.first_logger(); }

  void add_callback(callback entry) { services_.add_callback(std::move(entry)); }
  const std::vector<callback>& callbacks() const noexcept { return services_.callbacks(); }
  template <class Hook, class... Args>
  void call(Args&&... args) {
    services_.template call<Hook>(std::forward<Args>(args)...);
  }

  // --------------------------------------------------------- checkpoints
  // The strategy decides who writes what (the one-file strategies: global
  // rank zero, atomically). Under 16-mixed the scaler's state is added as
  // "precision".
  void save(const std::string& path, const state& checkpoint, const state_filter& filter = {}) {
    strategy_.save_checkpoint(path, with_precision(checkpoint), filter, metadata());
  }

  // Restores every entry of checkpoint in place, all or nothing; returns what
  // the file holds beyond them.
  state load(const std::string& path, const state& checkpoint, bool strict = true) {
    return strategy_.load_checkpoint(path, with_precision(checkpoint), strict);
  }

  // A state dict written by LibTorch (torch::save) or Python (torch.save of a
  // plain dict), into a module or (LibTorch only) an optimizer.
  template <class Target>
  void load_raw(const std::string& path, Target& target, bool strict = true) {
    if constexpr (is_fabric_module<Target> || ModuleHolder<Target>) {
      load_raw_module(path, *target, strict);
    } else if constexpr (is_fabric_optimizer<Target>) {
      load_raw_optimizer(path, target.optimizer());
    } else {
      static_assert(std::is_base_of_v<torch::optim::Optimizer, Target>,
                    "loom::Fabric::load_raw(path, target): target must be a module or an optimizer.");
      load_raw_optimizer(path, target);
    }
  }

 private:
  template <class O>
  optimizer_type<O> wrap_optimizer(O& optimizer) {
    return optimizer_type<O>(optimizer, strategy_, precision_, next_optimizer_slot());
  }

  state with_precision(const state& checkpoint) {
    state full = checkpoint;
    if constexpr (has_precision_state<P>) {
      if (!full.contains("precision")) {
        state_entry entry("precision", precision_);
        full.add(std::move(entry.optional()));
      }
    }
    return full;
  }

  checkpoint_metadata metadata() const {
    checkpoint_metadata meta;
    meta.world_size = strategy_.world_size();
    meta.global_rank = strategy_.global_rank();
    meta.strategy = std::string(S::name);
    meta.precision = std::string(P::name);
    return meta;
  }

  S strategy_;
  P precision_;
  detail::fabric_services services_;
  int next_optimizer_slot_ = 0;
};

}  // namespace loom
