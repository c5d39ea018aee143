// A checkpoint's state: names mapped to what is saved and restored in place:
// modules, optimizers, tensors, plain values (by reference or owned), and any
// object with state_dict()/load_state_dict(). As Lightning's `state` dict.
#pragma once

#include <loom/util/module_fwd.hpp>
#include <loom/util/module_holder.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <concepts>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

// Per entry, which items of a module's state dict to save (Lightning's filter).
using state_filter = std::map<std::string, std::function<bool(std::string_view key, const at::Tensor& value)>>;

namespace detail {

// The names of the parameters of a checkpoint's module entries (dotted, as in
// each module's state dict), so an optimizer's state can be keyed by name as
// torch.optim's full state dicts are.
class parameter_names {
 public:
  void add_module(const torch::nn::Module& module);
  // nullopt for a parameter of no module entry, or a name two entries share.
  std::optional<std::string> name_of(const at::Tensor& parameter) const;
  // The parameter of that name, or nullptr.
  const at::Tensor* parameter(std::string_view name) const;

 private:
  std::map<const void*, std::string> names_;
  std::map<std::string, at::Tensor, std::less<>> parameters_;
  std::vector<std::string> ambiguous_;
};

// One saveable thing. Loading is split so a checkpoint can be validated in
// full before anything changes: validate() never mutates, load() may throw
// only where validation cannot see (an optimizer's inner layout), and
// snapshot() captures what load() would overwrite, for rollback.
// names: the parameter names of the checkpoint's module entries.
struct entry_io {
  virtual ~entry_io() = default;
  virtual std::string_view kind() const noexcept = 0;
  virtual c10::IValue save(const state_filter::mapped_type* filter, const parameter_names& names) const = 0;
  // Empty string when value can be loaded; else what is wrong with it.
  virtual std::string validate(const c10::IValue& value, bool strict, const parameter_names& names) const = 0;
  virtual void load(const c10::IValue& value, bool strict, const parameter_names& names) = 0;
  // Whether load() can fail after validate() passed (then a snapshot is taken).
  virtual bool fallible_load() const noexcept { return false; }
  virtual c10::IValue snapshot(const parameter_names& names) const { return save(nullptr, names); }
  // For owned values: the value itself (updated by load).
  virtual c10::IValue* owned() noexcept { return nullptr; }
  // For modules: the module (its parameters name an optimizer's state).
  virtual const torch::nn::Module* module() const noexcept { return nullptr; }
  // For optimizers: the C++ type, recorded in the checkpoint's metadata.
  virtual std::string type_name() const { return {}; }
  // For optimizers: the optimizer (sharded strategies gather its state).
  virtual torch::optim::Optimizer* optimizer() const noexcept { return nullptr; }
};

std::shared_ptr<entry_io> module_io(std::shared_ptr<torch::nn::Module> module);
std::shared_ptr<entry_io> optimizer_io(torch::optim::Optimizer& optimizer);
std::shared_ptr<entry_io> tensor_io(at::Tensor& tensor);
std::shared_ptr<entry_io> owned_io(c10::IValue value);
std::shared_ptr<entry_io> stateful_io(std::function<c10::IValue()> save,
                                          std::function<void(const c10::IValue&)> load, std::string kind);

// A plain value by reference: saved as an IValue, checked for its type on load.
template <class T>
class value_io final : public entry_io {
 public:
  explicit value_io(T& value) : value_(&value) {}
  std::string_view kind() const noexcept override { return "value"; }
  c10::IValue save(const state_filter::mapped_type* /*filter*/, const parameter_names& /*names*/) const override {
    if constexpr (std::is_same_v<T, bool>) return c10::IValue(*value_);
    else if constexpr (std::is_integral_v<T>) return c10::IValue(static_cast<int64_t>(*value_));
    else if constexpr (std::is_floating_point_v<T>) return c10::IValue(static_cast<double>(*value_));
    else return c10::IValue(*value_);
  }
  std::string validate(const c10::IValue& value, bool /*strict*/, const parameter_names& /*names*/) const override {
    if constexpr (std::is_same_v<T, bool>) return value.isBool() ? "" : "expected a bool, found " + value.tagKind();
    else if constexpr (std::is_integral_v<T>) return value.isInt() ? "" : "expected an integer, found " + value.tagKind();
    else if constexpr (std::is_floating_point_v<T>)
      return value.isDouble() || value.isInt() ? "" : "expected a number, found " + value.tagKind();
    else return value.isString() ? "" : "expected a string, found " + value.tagKind();
  }
  void load(const c10::IValue& value, bool /*strict*/, const parameter_names& /*names*/) override {
    if constexpr (std::is_same_v<T, bool>) *value_ = value.toBool();
    else if constexpr (std::is_integral_v<T>) *value_ = static_cast<T>(value.toInt());
    else if constexpr (std::is_floating_point_v<T>)
      *value_ = static_cast<T>(value.isInt() ? static_cast<double>(value.toInt()) : value.toDouble());
    else *value_ = value.toStringRef();
  }

 private:
  T* value_;
};

template <class T>
concept plain_value = std::is_arithmetic_v<T> || std::is_same_v<T, std::string>;

template <class T>
concept stateful_object = requires(T& object, const c10::IValue& value) {
  { object.state_dict() } -> std::convertible_to<c10::IValue>;
  object.load_state_dict(value);
};

}  // namespace detail

// One named entry. Lvalues are restored in place; rvalues are owned copies
// whose loaded value can be read back with state::get.
class state_entry {
 public:
  template <class Holder>
    requires ModuleHolder<Holder>
  state_entry(std::string name, const Holder& module)  // NOLINT
      : name_(std::move(name)), io_(detail::module_io(shared_module(module))) {}

  // What setup returned (a static or an erased Fabric's module wrapper).
  template <class Wrapped>
    requires(!ModuleHolder<Wrapped> && requires(Wrapped& wrapped) {
      { wrapped.module() } -> ModuleHolder;
    })
  state_entry(std::string name, Wrapped& module)  // NOLINT
      : state_entry(std::move(name), module.module()) {}

  template <class O>
    requires std::derived_from<O, torch::optim::Optimizer>
  state_entry(std::string name, O& optimizer)  // NOLINT
      : name_(std::move(name)), io_(detail::optimizer_io(optimizer)) {}

  template <class Wrapped>
    requires(!std::derived_from<Wrapped, torch::optim::Optimizer> && requires(Wrapped& wrapped) {
      { wrapped.optimizer() } -> std::convertible_to<torch::optim::Optimizer&>;
    })
  state_entry(std::string name, Wrapped& optimizer)  // NOLINT
      : state_entry(std::move(name), optimizer.optimizer()) {}

  state_entry(std::string name, at::Tensor& tensor)  // NOLINT
      : name_(std::move(name)), io_(detail::tensor_io(tensor)) {}

  state_entry(std::string name, c10::IValue value)  // NOLINT
      : name_(std::move(name)), io_(detail::owned_io(std::move(value))) {}

  template <class T>
    requires detail::plain_value<std::remove_cvref_t<T>> || std::is_convertible_v<T, std::string_view>
  state_entry(std::string name, T&& value)  // NOLINT
      : name_(std::move(name)) {
    using bare = std::remove_cvref_t<T>;
    if constexpr (std::is_lvalue_reference_v<T> && !std::is_const_v<std::remove_reference_t<T>> &&
                  detail::plain_value<bare>) {
      io_ = std::make_shared<detail::value_io<bare>>(value);
    } else if constexpr (std::is_same_v<bare, bool>) {
      io_ = detail::owned_io(c10::IValue(static_cast<bool>(value)));
    } else if constexpr (std::is_integral_v<bare>) {
      io_ = detail::owned_io(c10::IValue(static_cast<int64_t>(value)));
    } else if constexpr (std::is_floating_point_v<bare>) {
      io_ = detail::owned_io(c10::IValue(static_cast<double>(value)));
    } else {
      io_ = detail::owned_io(c10::IValue(std::string(std::string_view(value))));
    }
  }

  // Anything with state_dict() -> IValue and load_state_dict(const IValue&).
  template <class T>
    requires(detail::stateful_object<T> && !std::derived_from<T, torch::optim::Optimizer> && !ModuleHolder<T>)
  state_entry(std::string name, T& object)  // NOLINT
      : name_(std::move(name)),
        io_(detail::stateful_io([&object] { return c10::IValue(object.state_dict()); },
                                    [&object](const c10::IValue& value) { object.load_state_dict(value); },
                                    "stateful object")) {}

  const std::string& name() const noexcept { return name_; }
  detail::entry_io& io() const noexcept { return *io_; }
  // An entry that is not required is skipped by a strict load when the
  // checkpoint lacks it (loom's own "precision" entry).
  bool required() const noexcept { return required_; }
  state_entry& optional() noexcept {
    required_ = false;
    return *this;
  }

 private:
  template <class Holder>
  static std::shared_ptr<torch::nn::Module> shared_module(const Holder& module) {
    if constexpr (requires { module.ptr(); }) return module.ptr();
    else return module;
  }

  std::string name_;
  std::shared_ptr<detail::entry_io> io_;
  bool required_ = true;
};

class state {
 public:
  state() = default;
  state(std::initializer_list<state_entry> entries) : entries_(entries) {}

  // Adds or replaces an entry.
  template <class T>
  state& set(std::string name, T&& value) {
    erase(name);
    entries_.emplace_back(std::move(name), std::forward<T>(value));
    return *this;
  }
  void add(state_entry entry) {
    erase(entry.name());
    entries_.push_back(std::move(entry));
  }
  bool contains(std::string_view name) const { return find(name) != nullptr; }
  void erase(std::string_view name);
  const state_entry* find(std::string_view name) const;
  std::vector<std::string> names() const;
  const std::vector<state_entry>& entries() const noexcept { return entries_; }
  std::size_t size() const noexcept { return entries_.size(); }
  // The entries' optimizers and modules (the sharded strategies gather them
  // around a save or load).
  std::vector<torch::optim::Optimizer*> optimizers() const;
  std::vector<const torch::nn::Module*> modules() const;

  // An owned value (one given as an rvalue, or returned by load as not
  // consumed), converted to T. Throws when absent or not a T.
  template <class T>
  T get(std::string_view name) const {
    const c10::IValue& value = owned_value(name);
    if constexpr (std::is_same_v<T, c10::IValue>) return value;
    else if constexpr (std::is_same_v<T, bool>) return value.toBool();
    else if constexpr (std::is_integral_v<T>) return static_cast<T>(value.toInt());
    else if constexpr (std::is_floating_point_v<T>) return static_cast<T>(value.toDouble());
    else if constexpr (std::is_same_v<T, std::string>) return value.toStringRef();
    else if constexpr (std::is_same_v<T, at::Tensor>) return value.toTensor();
    else return value.to<T>();
  }

 private:
  const c10::IValue& owned_value(std::string_view name) const;
  std::vector<state_entry> entries_;
};

}  // namespace loom
