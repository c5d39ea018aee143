// basic_fabric<Derived, Backend>: Lightning Fabric's API, each member written
// once. The backend answers it: static_backend<A, S, P> with the policies as
// types (Fabric<A, S, P>: every call resolved by the compiler), or
// runtime::erased_backend with the combination chosen from strings
// (AnyFabric: one indirect call per API call). Where a strategy may refuse a
// call, the backend says so as a `decided`: a compile error in the static
// Fabric, a configuration_error in AnyFabric, with the same sentence.
//
// Derived is the facade class itself (Fabric<A, S, P> or AnyFabric): what
// launch(fn) and the rank-zero guard hand back to the user.
#pragma once

#include <loom/callbacks/callback.hpp>
#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/state.hpp>
#include <loom/comm/reduce_op.hpp>
#include <loom/errors.hpp>
#include <loom/fabric_services.hpp>
#include <loom/launch/run_launched.hpp>
#include <loom/loggers/logger.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/clip_gradients.hpp>
#include <loom/util/decided.hpp>
#include <loom/util/seed.hpp>
#include <loom/wrap/build_loader.hpp>
#include <loom/wrap/dataloader.hpp>
#include <loom/wrap/module.hpp>
#include <loom/wrap/optimizer.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

namespace detail {
// The sentences of the calls a strategy may refuse, for both facades: macros
// because a static_assert takes only a string literal (undefined at the end
// of this header).
#define LOOM_SENTENCE_JOINT_SETUP \
  "this strategy sets up the module and its optimizers together; call fabric.setup(module, optimizer...) instead."
#define LOOM_SENTENCE_LOADER_NEEDS_SAMPLER                                                                          \
  "this strategy shards data with a distributed sampler, which loom can insert only into a loader it builds. Pass " \
  "the dataset and loom::loader_options instead."
#define LOOM_SENTENCE_CANNOT_SKIP_SYNC                                                                        \
  "this strategy cannot skip gradient synchronisation (its `supports_no_backward_sync` is absent or false; "   \
  "fsdp_cpu_offload and the deepspeed offload presets refuse it: skipped reductions would keep unsharded "    \
  "gradients on the device, which offloading is there to free). Use "                                          \
  "loom::ddp, loom::fsdp or loom::single_device, or accumulate without it."

[[noreturn]] inline void refuse(std::string_view call, std::string_view strategy, const char* sentence) {
  throw configuration_error(std::string(call) + ": strategy '" + std::string(strategy) + "': " + sentence);
}
}  // namespace detail

template <class Derived, class Backend>
class basic_fabric {
 public:
  using backend_type = Backend;
  // Whether no_backward_sync compiles (then supports_no_backward_sync() says
  // whether it skips; the static Fabric knows at compile time).
  static constexpr bool may_skip_backward_sync = Backend::skip_backward_sync != decided::never;
  template <ModuleHolder Holder>
  using module_type = wrapped_module<Holder, typename Backend::session_type>;
  template <class O>
  using optimizer_type = wrapped_optimizer<O, typename Backend::stepper_type>;

  // Wrappers returned by setup point into this object.
  basic_fabric(const basic_fabric&) = delete;
  basic_fabric& operator=(const basic_fabric&) = delete;
  basic_fabric(basic_fabric&&) = delete;
  basic_fabric& operator=(basic_fabric&&) = delete;

  // What was chosen: "cpu", the strategy's name (AnyFabric: the registered
  // name, e.g. "ddp_find_unused_parameters_true"), "bf16-mixed".
  std::string_view accelerator_name() const noexcept { return backend_.accelerator_name(); }
  std::string_view strategy_name() const noexcept { return backend_.strategy_name(); }
  std::string_view precision_name() const noexcept { return backend_.precision_name(); }
  // The backend, for the erased model (runtime/fabric_model.hpp) and extensions.
  Backend& backend() noexcept { return backend_; }
  const Backend& backend() const noexcept { return backend_; }

  // ---------------------------------------------------------------- launch
  // Starts the strategy's processes: a no-op with one process, or when the
  // program was started by loom-run, torchrun, srun or mpirun (where Lightning
  // raises; loom lets one program run under every launcher).
  void launch() { backend_.launch(); }
  // Runs fn(fabric) on every process of the strategy. Under the fork launcher
  // the forked processes end when fn returns (status 0, or 1 if it threw).
  template <class Function>
  decltype(auto) launch(Function&& function) {
    launch();
    return detail::run_launched(self(), std::forward<Function>(function), backend_.is_forked_child());
  }

  // ----------------------------------------------------------------- setup
  // The module converted to the precision and moved to the device, and each
  // optimizer wired to step through the strategy and precision. Returns the
  // module alone when no optimizer is given, else a tuple. A strategy that
  // needs_joint_setup (ZeRO) sets the module up together with its optimizers.
  template <ModuleHolder Holder, class... Optimizers>
  [[nodiscard("train through what setup returns")]]
  auto setup(Holder module, Optimizers&... optimizers) {
    static_assert(Backend::joint_setup != decided::always || sizeof...(Optimizers) > 0,
                  "loom::Fabric::setup: this strategy sets up the module and its optimizers together; pass them "
                  "all: fabric.setup(module, optimizer...).");
    if constexpr (sizeof...(Optimizers) == 0) {
      return setup_module(std::move(module));
    } else if constexpr (Backend::joint_setup == decided::always) {
      return setup_jointly(std::move(module), optimizers...);
    } else if constexpr (Backend::joint_setup == decided::never) {
      return setup_separately(std::move(module), optimizers...);
    } else {
      if (backend_.needs_joint_setup()) return setup_jointly(std::move(module), optimizers...);
      return setup_separately(std::move(module), optimizers...);
    }
  }

  template <ModuleHolder Holder>
  [[nodiscard]] module_type<Holder> setup_module(Holder module, bool move_to_device = true) {
    static_assert(Backend::joint_setup != decided::always,
                  "loom::Fabric::setup_module: " LOOM_SENTENCE_JOINT_SETUP);
    refuse_at_run_time<Backend::joint_setup>(backend_.needs_joint_setup(), "setup_module",
                                             LOOM_SENTENCE_JOINT_SETUP);
    auto session = backend_.setup_module(*module, move_to_device);
    return module_type<Holder>(std::move(module), std::move(session));
  }

  template <class... Optimizers>
    requires(sizeof...(Optimizers) > 0)
  [[nodiscard]] auto setup_optimizers(Optimizers&... optimizers) {
    static_assert(Backend::joint_setup != decided::always,
                  "loom::Fabric::setup_optimizers: " LOOM_SENTENCE_JOINT_SETUP);
    refuse_at_run_time<Backend::joint_setup>(backend_.needs_joint_setup(), "setup_optimizers",
                                             LOOM_SENTENCE_JOINT_SETUP);
    if constexpr (sizeof...(Optimizers) == 1) return wrap_optimizer(optimizers...);
    else return std::tuple<optimizer_type<Optimizers>...>(wrap_optimizer(optimizers)...);
  }

  // Builds a LibTorch loader over dataset (a torch::data dataset: per-example,
  // whose examples are stacked, or batch-producing such as
  // loom::data::tensor_dataset), with the strategy's sampler; batches arrive
  // on the device.
  template <class Dataset>
  [[nodiscard]] auto setup_dataloaders(Dataset dataset, const loader_options& options) {
    return detail::build_loader(std::move(dataset), options, backend_.sampler_replicas(), backend_.sampler_rank(),
                                device());
  }

  // A loader the user built: batches are moved to the device, nothing else.
  template <class Loader>
  [[nodiscard]] auto setup_dataloaders(std::unique_ptr<Loader> loader, bool move_to_device = true) {
    static_assert(Backend::distributed_sampler != decided::always,
                  "loom::Fabric::setup_dataloaders(loader): " LOOM_SENTENCE_LOADER_NEEDS_SAMPLER);
    refuse_at_run_time<Backend::distributed_sampler>(backend_.needs_distributed_sampler(), "setup_dataloaders(loader)",
                                                     LOOM_SENTENCE_LOADER_NEEDS_SAMPLER);
    return fabric_dataloader<Loader>(std::move(loader), device(), move_to_device, nullptr, std::nullopt);
  }

  // -------------------------------------------------------------- training
  // Through the strategy (an engine may own backward), which asks the
  // precision to scale the loss.
  void backward(const at::Tensor& loss) { backend_.backward(loss); }

  // Unscales the gradients first (16-mixed), then clips by norm or by value
  // through the strategy (a sharded one reduces the norm over its shards).
  // Returns the total norm of the whole model when clipping by norm.
  template <class Module, class Optimizer>
  std::optional<double> clip_gradients(Module& module, Optimizer& optimizer, const clip_options& options) {
    static_assert(WrappedModule<Module> && is_wrapped_optimizer<Optimizer>,
                  "loom::Fabric::clip_gradients(module, optimizer, options): pass the module and optimizer that "
                  "fabric.setup returned.");
    detail::check_clip_options(options);
    backend_.unscale_gradients(optimizer.optimizer(), optimizer.slot());
    return module.session().clip_gradients(*module, options);
  }

  // The precision's forward context, for code outside the wrapped forward.
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto autocast() const { return backend_.autocast(); }

  // Whether no_backward_sync skips synchronisation with this strategy.
  constexpr bool supports_no_backward_sync() const noexcept {
    if constexpr (Backend::skip_backward_sync == decided::at_run_time) return backend_.supports_no_backward_sync();
    else return Backend::skip_backward_sync == decided::always;
  }
  // Under DDP, skips gradient synchronisation for the backward passes inside
  // the guard's lifetime. A compile error (AnyFabric: a configuration_error)
  // where the strategy cannot skip it.
  template <class Module>
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto no_backward_sync(Module& module, bool enabled = true) {
    static_assert(Backend::skip_backward_sync != decided::never,
                  "loom::Fabric::no_backward_sync: " LOOM_SENTENCE_CANNOT_SKIP_SYNC);
    static_assert(WrappedModule<Module>,
                  "loom::Fabric::no_backward_sync(module): pass the module that fabric.setup returned.");
    refuse_at_run_time<Backend::skip_backward_sync>(!supports_no_backward_sync(), "no_backward_sync",
                                                    LOOM_SENTENCE_CANNOT_SKIP_SYNC);
    return module.session().no_backward_sync(enabled);
  }

  // Tensors (or containers of them) moved to the device; a module holder
  // moved in place.
  template <class T>
  auto to_device(T&& value) const {
    const c10::Device target = device();
    if constexpr (ModuleHolder<T>) {
      value->to(target);
      return std::forward<T>(value);
    } else {
      return apply_to_collection(std::forward<T>(value),
                                 [&target](const at::Tensor& t) { return detail::move_tensor(t, target); });
    }
  }

  // While alive, new tensors and modules get the precision's dtype. LibTorch
  // 1.13 has no default device: modules are moved at setup.
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto init_tensor() const { return backend_.init_context(); }
  // empty_init (Lightning's empty_init=True): under fsdp FULL_SHARD and
  // deepspeed stage 3 (32-true) on more than one rank, each loom::unit<M>
  // built inside keeps only this rank's shard of its parameters from the
  // moment its constructor returns (loom/strategy/unit_construction.hpp);
  // elsewhere it has no effect (single_device and ddp initialise as usual,
  // where Lightning skips the initialisation; docs/fsdp.md).
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto init_module(bool empty_init = false) const { return backend_.init_module_context(empty_init); }

  std::uint64_t seed_everything(std::optional<std::uint64_t> seed = std::nullopt) {
    return loom::seed_everything(seed);
  }

  // ---------------------------------------------------------- processes
  int global_rank() const { return backend_.global_rank(); }
  int local_rank() const { return backend_.local_rank(); }
  int node_rank() const { return backend_.node_rank(); }
  int world_size() const { return backend_.world_size(); }
  bool is_global_zero() const { return global_rank() == 0; }
  c10::Device device() const { return backend_.device(); }
  void barrier() { backend_.barrier(); }

  // Prints its arguments, separated by spaces, on global rank zero.
  template <class... Args>
  void print(const Args&... args) const {
    detail::print_on_zero(is_global_zero(), args...);
  }

  // Rank zero runs the guarded block first, the others wait for it (e.g. to
  // download or preprocess once).
  [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]]
  auto rank_zero_first() { return detail::rank_zero_first_guard<Derived>(self()); }

  // ---------------------------------------------------------- collectives
  // Each takes a tensor or a nested container of tensors and returns a value
  // of the same shape; the inputs are not modified. On one process they are
  // identities (the static Fabric resolves that at compile time).
  template <class T>
  auto all_reduce(T&& value, reduce_op op = reduce_op::sum) {
    return backend_.all_reduce(std::forward<T>(value), op);
  }
  // In place, without a copy (the hot-path form).
  void all_reduce_(at::Tensor& tensor, reduce_op op = reduce_op::sum) { backend_.all_reduce_(tensor, op); }
  // Lightning's all_gather: each tensor becomes [world_size, ...] (equal
  // shapes), or stays as it is on one process (no added dimension, as
  // Lightning); with sync_grads the result keeps autograd across ranks.
  template <class T>
  auto all_gather(T&& value, bool sync_grads = false) {
    return backend_.all_gather(std::forward<T>(value), sync_grads);
  }
  // Each tensor becomes a std::vector with one tensor per rank; shapes may differ across ranks.
  template <class T>
  auto all_gather_per_rank(T&& value) {
    return backend_.all_gather_per_rank(std::forward<T>(value));
  }
  template <class T>
  auto broadcast(T&& value, int source = 0) {
    return backend_.broadcast(std::forward<T>(value), source);
  }
  // Each tensor's first dimension is world_size * n; every rank gets its n rows of the reduction.
  template <class T>
  auto reduce_scatter(T&& value, reduce_op op = reduce_op::sum) {
    return backend_.reduce_scatter(std::forward<T>(value), op);
  }
  // Numbers, strings, lists, dicts, tensors (anything c10::IValue holds), through LibTorch's pickler.
  c10::IValue broadcast_object(const c10::IValue& value, int source = 0) {
    return backend_.broadcast_object(value, source);
  }
  template <class T>
    requires(!std::is_same_v<std::remove_cvref_t<T>, c10::IValue>)
  T broadcast_object(const T& value, int source = 0) {
    return backend_.broadcast_object(c10::IValue(value), source).template to<T>();
  }
  bool reduce_boolean_decision(bool decision, bool all = true) {
    return backend_.reduce_boolean_decision(decision, all);
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
    backend_.save(path, checkpoint, filter);
  }
  // Restores every entry of checkpoint in place, all or nothing; returns what
  // the file holds beyond them.
  state load(const std::string& path, const state& checkpoint, bool strict = true) {
    return backend_.load(path, checkpoint, strict);
  }

  // A state dict written by LibTorch (torch::save) or Python (torch.save of a
  // plain dict), into a module or (LibTorch only) an optimizer.
  template <class Target>
  void load_raw(const std::string& path, Target& target, bool strict = true) {
    if constexpr (WrappedModule<Target> || ModuleHolder<Target>) {
      load_raw_module(path, *target, strict);
    } else if constexpr (is_wrapped_optimizer<Target>) {
      load_raw_optimizer(path, target.optimizer());
    } else {
      static_assert(std::is_base_of_v<torch::optim::Optimizer, Target>,
                    "loom::Fabric::load_raw(path, target): target must be a module or an optimizer.");
      load_raw_optimizer(path, target);
    }
  }

 protected:
  template <class... BackendArgs>
  basic_fabric(std::vector<logger> loggers, std::vector<callback> callbacks, BackendArgs&&... backend_args)
      : backend_(std::forward<BackendArgs>(backend_args)...), services_(std::move(loggers), std::move(callbacks)) {}

 private:
  Derived& self() noexcept { return static_cast<Derived&>(*this); }

  template <class Holder, class... Optimizers>
  auto setup_jointly(Holder module, Optimizers&... optimizers) {
    const std::array<torch::optim::Optimizer*, sizeof...(Optimizers)> all{&optimizers...};
    auto session = backend_.setup_module_jointly(*module, all);
    return bundle(std::move(module), std::move(session), optimizers...);
  }
  template <class Holder, class Session, class... Optimizers>
  auto bundle(Holder module, Session session, Optimizers&... optimizers) {
    return std::tuple<module_type<Holder>, optimizer_type<Optimizers>...>(
        module_type<Holder>(std::move(module), std::move(session)), wrap_optimizer(optimizers)...);
  }
  template <class Holder, class... Optimizers>
  auto setup_separately(Holder module, Optimizers&... optimizers) {
    auto session = backend_.setup_module(*module, /*move_to_device=*/true);
    return bundle(std::move(module), std::move(session), optimizers...);
  }

  template <class O>
  optimizer_type<O> wrap_optimizer(O& optimizer) {
    const optimizer_slot slot = backend_.next_optimizer_slot(optimizer);
    return optimizer_type<O>(optimizer, backend_.stepper(), slot);
  }

  // The run-time half of a refusal whose compile-time half is a static_assert.
  template <decided Question>
  void refuse_at_run_time(bool refused, std::string_view call, const char* sentence) const {
    if constexpr (Question == decided::at_run_time) {
      if (refused) detail::refuse(call, strategy_name(), sentence);
    }
  }

  Backend backend_;
  detail::fabric_services services_;
};

}  // namespace loom

#undef LOOM_SENTENCE_JOINT_SETUP
#undef LOOM_SENTENCE_LOADER_NEEDS_SAMPLER
#undef LOOM_SENTENCE_CANNOT_SKIP_SYNC
