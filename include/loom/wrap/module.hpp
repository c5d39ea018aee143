// What setup returns for a module: the user's module, unchanged, whose forward
// runs through a session (the strategy's and precision's view of this module:
// input/output conversion, the forward context, the strategy's preparation
// for backward). The forward-order rule lives here, once, for the static
// session (wrap/strategy_session.hpp) and the erased one
// (runtime/erased_backend.hpp). For fp32 on one device every step is empty
// and forward is exactly module->forward(args...).
#pragma once

#include <loom/concepts/strategy.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/decided.hpp>
#include <loom/util/module_holder.hpp>

#include <functional>
#include <type_traits>
#include <utility>

namespace loom {

namespace detail {
// module.forward(args...) as a callable, so forward is one case of run.
struct call_forward {
  template <class Impl, class... Args>
  decltype(auto) operator()(Impl& module, Args&&... args) const {
    return module.forward(std::forward<Args>(args)...);
  }
};
}  // namespace detail

// Session: what a module wrapper asks of its strategy and precision.
//   static constexpr decided io_conversion;      whether inputs/outputs are converted
//   bool converts_io() const;                    the answer when at_run_time
//   auto forward_context();                      the precision's guard for the forward
//   decltype(auto) forward(Module&, Body&&);     body() inside the strategy's forward
//   at::Tensor convert_input(const at::Tensor&) const;   and convert_output
//   std::optional<double> clip_gradients(torch::nn::Module&, const clip_options&);
//   auto no_backward_sync(bool enabled);         the strategy's guard
template <ModuleHolder Holder, class Session>
class wrapped_module {
 public:
  using holder_type = Holder;
  using impl_type = module_impl_t<Holder>;
  using session_type = Session;

  wrapped_module(Holder module, Session session) : module_(std::move(module)), session_(std::move(session)) {}

  template <class... Args>
  decltype(auto) operator()(Args&&... args) {
    return forward(std::forward<Args>(args)...);
  }

  template <class... Args>
  decltype(auto) forward(Args&&... args) {
    return run(detail::call_forward{}, std::forward<Args>(args)...);
  }

  // Runs method(module, args...) the way forward runs: inputs converted by
  // the precision, under its context and the strategy's forward (DDP arms
  // its reducer from the outputs), outputs converted after the context ends,
  // as in Lightning. Lightning redirects training_step and validation_step
  // through forward for the same reasons; loom's trainer calls them through
  // here.
  template <class Method, class... Args>
  decltype(auto) run(Method&& method, Args&&... args) {
    if constexpr (replicates_forward<Session>) {
      return run_replicated(method, args...);
    } else if constexpr (Session::io_conversion == decided::never) {
      return run_as_written(method, std::forward<Args>(args)...);
    } else if constexpr (Session::io_conversion == decided::always) {
      return run_converted(method, std::forward<Args>(args)...);
    } else {
      // Only one of the two runs, so forwarding args in both is safe.
      if (session_.converts_io()) return run_converted(method, std::forward<Args>(args)...);
      return run_as_written(method, std::forward<Args>(args)...);
    }
  }

  impl_type* operator->() noexcept { return &*module_; }
  const impl_type* operator->() const noexcept { return &*module_; }
  impl_type& operator*() noexcept { return *module_; }
  // The holder the user passed in (shares the module, like every holder copy).
  Holder& module() noexcept { return module_; }
  const Holder& module() const noexcept { return module_; }
  // The strategy's and precision's view of this module (DDP: its reducer).
  Session& session() noexcept { return session_; }

 private:
  template <class Method, class... Args>
  decltype(auto) run_as_written(Method& method, Args&&... args) {
    impl_type& impl = *module_;
    return session_.forward(impl, [&]() -> decltype(auto) {
      return std::invoke(method, impl, std::forward<Args>(args)...);
    });
  }

  template <class Method, class... Args>
  auto run_converted(Method& method, Args&&... args) {
    impl_type& impl = *module_;
    Session& session = session_;
    auto to_input = [&session](const at::Tensor& t) { return session.convert_input(t); };
    auto output = [&] {
      auto context = session.forward_context();
      return session.forward(impl, [&] {
        return std::invoke(method, impl, apply_to_collection(std::forward<Args>(args), to_input)...);
      });
    }();  // the context ends here, before the outputs are converted
    return apply_to_collection(std::move(output), [&session](const at::Tensor& t) { return session.convert_output(t); });
  }

  // The strategy runs each replica (dp: in a thread of its own, so the
  // precision's context, which is per thread, is entered in each); outputs
  // are converted once gathered.
  template <class Method, class... Args>
  auto run_replicated(Method& method, const Args&... args) {
    Session& session = session_;
    auto output = session.forward_replicas(*module_, [&session, &method](impl_type& replica, const auto&... chunk) {
      auto context = session.forward_context();
      if constexpr (Session::io_conversion == decided::never) {
        return std::invoke(method, replica, chunk...);
      } else {
        auto to_input = [&session](const at::Tensor& t) { return session.convert_input(t); };
        if (!session.converts_io()) return std::invoke(method, replica, chunk...);
        return std::invoke(method, replica, apply_to_collection(chunk, to_input)...);
      }
    }, args...);
    if constexpr (Session::io_conversion == decided::never) {
      return output;
    } else {
      if (!session.converts_io()) return output;
      return apply_to_collection(std::move(output), [&session](const at::Tensor& t) { return session.convert_output(t); });
    }
  }

  Holder module_;
  Session session_;
};

// What setup returned for a module, over any session.
template <class T>
concept WrappedModule = requires {
  typename T::holder_type;
  typename T::session_type;
} && std::is_same_v<T, wrapped_module<typename T::holder_type, typename T::session_type>>;

}  // namespace loom
