// loom::unit<M>: the holder a model declares for a block that sharded
// strategies treat as one unit (FSDP's wrapped module). LibTorch 1.13 has no
// module forward hooks, so the unit's own forward is the hook: until a
// strategy sets the model up, unit<M> is exactly M (same constructor, same
// forward, same parameter names); after, its forward gathers the unit's
// parameters first, frees them after (FULL_SHARD) and arranges for their
// gradients to be reduced as soon as its backward is done. Works inside
// torch::nn::Sequential (its forward has M's own signature where M has one).
#pragma once

#include <loom/strategy/unit_construction.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/held_module.hpp>
#include <loom/util/module_fwd.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/grad_mode.h>

#include <concepts>
#include <functional>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

namespace detail {
// A unit as the sharding engine keeps it (src/strategy/fsdp_unit.hpp).
struct sharded_unit;
// Called around a set-up unit's forward; compiled once, no virtual call.
void unit_pre_forward(sharded_unit& unit);
void unit_watch_output(sharded_unit& unit, const at::Tensor& output);
void unit_post_forward(sharded_unit& unit);
// Whether the unit recomputes its forward in backward (activation checkpointing).
bool unit_checkpoints(const sharded_unit& unit);
// The forward run without keeping activations, and recomputed in backward
// from `inputs` with the RNG state it first ran with (a custom autograd
// Function: LibTorch 1.13 has no checkpoint API). compiled once.
at::Tensor checkpointed_forward(const std::vector<at::Tensor>& inputs,
                                std::function<at::Tensor(const std::vector<at::Tensor>&)> run);
}  // namespace detail

// What the engine finds among a model's modules at setup (dynamic_cast, once).
class unit_marker {
 public:
  virtual ~unit_marker() = default;
  // Lightning's activation_checkpointing_policy, per unit: recompute this
  // unit's forward in backward instead of keeping its activations.
  void checkpoint_activations(bool enabled = true) noexcept { checkpoint_activations_ = enabled; }
  bool checkpoints_activations() const noexcept { return checkpoint_activations_; }

  // Set by the engine at setup (nullptr: not set up; forward is M's).
  detail::sharded_unit* sharded() const noexcept { return unit_; }
  void attach(detail::sharded_unit* unit) noexcept { unit_ = unit; }
  // Whether this unit's forward can be recomputed (it takes tensors and
  // returns one): what activation checkpointing needs.
  virtual bool can_checkpoint() const noexcept { return false; }

  // What sharded construction left (unit_construction.hpp): this rank's
  // shard of the unit's own parameters, which setup adopts; null: built whole.
  const detail::constructed_shard* constructed() const noexcept { return constructed_.get(); }
  detail::constructed_shard* constructed() noexcept { return constructed_.get(); }
  void set_constructed(std::shared_ptr<detail::constructed_shard> built) noexcept { constructed_ = std::move(built); }

 protected:
  template <class Result, class Body>
  Result run_unit(Body&& body) {
    if (unit_ == nullptr) return std::forward<Body>(body)();
    detail::unit_pre_forward(*unit_);
    Result out = std::forward<Body>(body)();
    for_each_tensor(out, [this](const at::Tensor& tensor) { detail::unit_watch_output(*unit_, tensor); });
    detail::unit_post_forward(*unit_);
    return out;
  }
  // The same, with the module's forward recomputed in backward.
  template <class Recompute>
  at::Tensor run_checkpointed(std::vector<at::Tensor> inputs, Recompute recompute) {
    detail::unit_pre_forward(*unit_);
    at::Tensor out = detail::checkpointed_forward(inputs, std::move(recompute));
    detail::unit_watch_output(*unit_, out);
    detail::unit_post_forward(*unit_);
    return out;
  }
  bool checkpointing() const { return unit_ != nullptr && detail::unit_checkpoints(*unit_); }

 private:
  detail::sharded_unit* unit_ = nullptr;
  bool checkpoint_activations_ = false;
  std::shared_ptr<detail::constructed_shard> constructed_;
};

namespace detail {

// A unit's last member: constructed once M and the marker are, it hands
// the finished unit to sharded construction (a no-op outside init_module(true)).
struct construction_hook {
  construction_hook(torch::nn::Module& unit, unit_marker& marker) { unit_constructed(unit, marker); }
};

template <class Impl>
constexpr bool is_module_impl() {
  static_assert(std::derived_from<Impl, torch::nn::Module>,
                "loom::unit<M>: M must be a LibTorch module, a torch::nn::Module subclass (BlockImpl) or the "
                "TORCH_MODULE holder of one (Block, torch::nn::Linear); a unit shards the parameters a module "
                "registers, and this type registers none.");
  return std::derived_from<Impl, torch::nn::Module>;
}

// M's forward as a member pointer, when it has exactly one non-template forward.
template <class Impl>
using forward_pointer_t = decltype(&Impl::forward);

template <class Impl, class Pointer>
class unit_impl_of;

// forward with M's own signature (what Sequential's AnyModule needs).
template <class Impl, class Result, class Class, class... Args>
class unit_impl_of<Impl, Result (Class::*)(Args...)> : public Impl, public unit_marker {
  // Tensors in, one tensor out: the forward can be recomputed from its inputs.
  static constexpr bool recomputable =
      std::is_same_v<Result, at::Tensor> && (std::is_same_v<std::remove_cvref_t<Args>, at::Tensor> && ...);

 public:
  using Impl::Impl;
  bool can_checkpoint() const noexcept override { return recomputable; }
  Result forward(Args... args) {
    if constexpr (recomputable) {
      if (this->checkpointing() && at::GradMode::is_enabled()) {
        return this->run_checkpointed({at::Tensor(args)...}, [this](const std::vector<at::Tensor>& inputs) {
          return call(inputs, std::index_sequence_for<Args...>{});
        });
      }
    }
    return this->template run_unit<Result>([&]() -> Result { return Impl::forward(std::forward<Args>(args)...); });
  }

 private:
  template <std::size_t... I>
  at::Tensor call(const std::vector<at::Tensor>& inputs, std::index_sequence<I...>) {
    return Impl::forward(inputs[I]...);
  }

  [[no_unique_address]] construction_hook constructed_{*this, *this};
};

// M's forward is a template or overloaded: forward whatever M accepts.
template <class Impl>
class unit_impl_of<Impl, void> : public Impl, public unit_marker {
 public:
  using Impl::Impl;
  template <class... Args>
  auto forward(Args&&... args) -> decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...)) {
    using result = decltype(std::declval<Impl&>().forward(std::forward<Args>(args)...));
    return this->template run_unit<result>([&]() -> result { return Impl::forward(std::forward<Args>(args)...); });
  }

 private:
  [[no_unique_address]] construction_hook constructed_{*this, *this};
};

template <class Impl>
struct unit_impl_select {
  using type = unit_impl_of<Impl, void>;
};
template <class Impl>
  requires requires { &Impl::forward; }
struct unit_impl_select<Impl> {
  using type = unit_impl_of<Impl, forward_pointer_t<Impl>>;
};

}  // namespace detail

template <class M>
  requires(detail::is_module_impl<held_module_t<M>>())
using unit_impl = typename detail::unit_impl_select<held_module_t<M>>::type;

// The holder: loom::unit<torch::nn::Linear> fc{784, 1024}; or
// loom::unit<BlockImpl> block{options}; register it as any module.
template <class M>
class unit : public torch::nn::ModuleHolder<unit_impl<M>> {
 public:
  using torch::nn::ModuleHolder<unit_impl<M>>::ModuleHolder;
};

}  // namespace loom
