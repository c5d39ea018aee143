// The entry I/O behind loom::state: how each kind of entry saves, validates and
// restores itself.
#include <loom/checkpoint/state.hpp>
#include <loom/errors.hpp>

#include "optimizer_state.hpp"

#include <ATen/ATen.h>
#include <c10/util/StringUtil.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Type.h>
#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

namespace loom {
namespace detail {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + ("'" + item + "'");
  return out;
}

// The module's state dict: parameters, then buffers, by dotted name.
std::vector<std::pair<std::string, at::Tensor>> module_items(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> items;
  for (const auto& item : module.named_parameters(/*recurse=*/true)) items.emplace_back(item.key(), item.value());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) items.emplace_back(item.key(), item.value());
  return items;
}

class module_io_impl final : public entry_io {
 public:
  explicit module_io_impl(std::shared_ptr<torch::nn::Module> module) : module_(std::move(module)) {}
  std::string_view kind() const noexcept override { return "module"; }
  const torch::nn::Module* module() const noexcept override { return module_.get(); }

  c10::IValue save(const state_filter::mapped_type* filter, const parameter_names& /*names*/) const override {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
    for (auto& [key, tensor] : module_items(*module_)) {
      if (filter != nullptr && *filter && !(*filter)(key, tensor)) continue;
      dict.insert(key, tensor.detach());
    }
    return dict;
  }

  c10::IValue snapshot(const parameter_names& /*names*/) const override {
    c10::impl::GenericDict dict(c10::StringType::get(), c10::TensorType::get());
    for (auto& [key, tensor] : module_items(*module_)) dict.insert(key, tensor.detach().clone());
    return dict;
  }

  std::string validate(const c10::IValue& value, bool strict, const parameter_names& /*names*/) const override {
    if (!value.isGenericDict()) return "expected a module state dict, found " + value.tagKind();
    const auto dict = value.toGenericDict();
    std::vector<std::string> missing;
    std::vector<std::string> unexpected;
    std::vector<std::string> mismatched;
    std::vector<std::string> known;
    for (auto& [key, tensor] : module_items(*module_)) {
      known.push_back(key);
      auto it = dict.find(key);
      if (it == dict.end()) {
        missing.push_back(key);
        continue;
      }
      if (!it->value().isTensor()) {
        mismatched.push_back("'" + key + "' is a " + it->value().tagKind() + ", not a tensor");
        continue;
      }
      const auto& saved = it->value().toTensor();
      if (saved.sizes() != tensor.sizes()) {
        mismatched.push_back("size mismatch for '" + key + "': the checkpoint has shape " + c10::str(saved.sizes()) +
                             ", the module has " + c10::str(tensor.sizes()));
      }
    }
    for (const auto& item : dict) {
      const auto& key = item.key().toStringRef();
      if (std::find(known.begin(), known.end(), key) == known.end()) unexpected.push_back(key);
    }
    std::string problems;
    if (strict && !missing.empty()) problems += "missing key(s) " + join(missing);
    if (strict && !unexpected.empty()) problems += (problems.empty() ? "" : "; ") + ("unexpected key(s) " + join(unexpected));
    for (const auto& m : mismatched) problems += (problems.empty() ? "" : "; ") + m;
    return problems;
  }

  void load(const c10::IValue& value, bool /*strict*/, const parameter_names& /*names*/) override {
    const auto dict = value.toGenericDict();
    at::NoGradGuard no_grad;
    for (auto& [key, tensor] : module_items(*module_)) {
      auto it = dict.find(key);
      if (it != dict.end()) tensor.copy_(it->value().toTensor());
    }
  }

 private:
  std::shared_ptr<torch::nn::Module> module_;
};

// SGD, Adam, AdamW, RMSprop and Adagrad in torch.optim's layout
// (optimizer_state.hpp); other optimizers serialise themselves into a
// LibTorch archive, kept as a uint8 tensor beside the optimizer's type.
// Format-1 checkpoints hold every optimizer that second way.
class optimizer_io_impl final : public entry_io {
 public:
  explicit optimizer_io_impl(torch::optim::Optimizer& optimizer)
      : optimizer_(&optimizer), type_(c10::demangle(typeid(optimizer).name())) {}
  std::string_view kind() const noexcept override { return "optimizer"; }
  bool fallible_load() const noexcept override { return true; }
  std::string type_name() const override { return type_; }
  torch::optim::Optimizer* optimizer() const noexcept override { return optimizer_; }

  c10::IValue save(const state_filter::mapped_type* /*filter*/, const parameter_names& names) const override {
    if (has_torch_optim_layout(*optimizer_)) return optimizer_to_dict(*optimizer_, names);
    torch::serialize::OutputArchive archive;
    optimizer_->save(archive);
    std::vector<char> bytes;
    archive.save_to([&bytes](const void* data, size_t size) {
      const auto* first = static_cast<const char*>(data);
      bytes.insert(bytes.end(), first, first + size);
      return size;
    });
    at::Tensor blob = at::empty({static_cast<int64_t>(bytes.size())}, at::kByte);
    std::memcpy(blob.data_ptr(), bytes.data(), bytes.size());
    c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
    dict.insert("type", type_);
    dict.insert("libtorch_archive", blob);
    return dict;
  }

  std::string validate(const c10::IValue& value, bool /*strict*/, const parameter_names& names) const override {
    if (!value.isGenericDict()) return "expected optimizer state, found " + value.tagKind();
    const auto dict = value.toGenericDict();
    if (!dict.contains("libtorch_archive")) {
      if (!has_torch_optim_layout(*optimizer_)) {
        return "it holds torch.optim's layout, which a " + type_ + " cannot read (it reads LibTorch's archive)";
      }
      return check_optimizer_dict(value, *optimizer_, names);
    }
    auto type = dict.find("type");
    auto blob = dict.find("libtorch_archive");
    if (type == dict.end() || !type->value().isString() || !blob->value().isTensor()) {
      return "expected optimizer state (a dict with 'type' and 'libtorch_archive'), found another dict";
    }
    if (type->value().toStringRef() != type_) {
      return "it holds the state of a " + type->value().toStringRef() + ", but the optimizer is a " + type_;
    }
    return "";
  }

  void load(const c10::IValue& value, bool /*strict*/, const parameter_names& names) override {
    const auto dict = value.toGenericDict();
    if (!dict.contains("libtorch_archive")) {
      load_optimizer_dict(value, *optimizer_, names);
      return;
    }
    const auto blob = dict.at("libtorch_archive").toTensor().contiguous();
    torch::serialize::InputArchive archive;
    archive.load_from(static_cast<const char*>(blob.data_ptr()), static_cast<size_t>(blob.numel()));
    optimizer_->load(archive);
  }

 private:
  torch::optim::Optimizer* optimizer_;
  std::string type_;
};

class tensor_io_impl final : public entry_io {
 public:
  explicit tensor_io_impl(at::Tensor& tensor) : tensor_(&tensor) {}
  std::string_view kind() const noexcept override { return "tensor"; }
  c10::IValue save(const state_filter::mapped_type* /*filter*/, const parameter_names& /*names*/) const override { return tensor_->detach(); }
  c10::IValue snapshot(const parameter_names& /*names*/) const override {
    return tensor_->defined() ? c10::IValue(tensor_->detach().clone()) : c10::IValue(*tensor_);
  }
  std::string validate(const c10::IValue& value, bool /*strict*/, const parameter_names& /*names*/) const override {
    return value.isTensor() ? "" : "expected a tensor, found " + value.tagKind();
  }
  void load(const c10::IValue& value, bool /*strict*/, const parameter_names& /*names*/) override {
    const auto& loaded = value.toTensor();
    // In place when the shape matches, so aliases of the tensor see the value.
    if (tensor_->defined() && loaded.defined() && tensor_->sizes() == loaded.sizes()) {
      at::NoGradGuard no_grad;
      tensor_->copy_(loaded);
    } else {
      *tensor_ = loaded;
    }
  }

 private:
  at::Tensor* tensor_;
};

class owned_io_impl final : public entry_io {
 public:
  explicit owned_io_impl(c10::IValue value) : value_(std::move(value)) {}
  std::string_view kind() const noexcept override { return "value"; }
  c10::IValue save(const state_filter::mapped_type* /*filter*/, const parameter_names& /*names*/) const override { return value_; }
  std::string validate(const c10::IValue& /*value*/, bool /*strict*/, const parameter_names& /*names*/) const override { return ""; }
  void load(const c10::IValue& value, bool /*strict*/, const parameter_names& /*names*/) override { value_ = value; }
  c10::IValue* owned() noexcept override { return &value_; }

 private:
  c10::IValue value_;
};

class stateful_io_impl final : public entry_io {
 public:
  stateful_io_impl(std::function<c10::IValue()> save, std::function<void(const c10::IValue&)> load, std::string kind)
      : save_(std::move(save)), load_(std::move(load)), kind_(std::move(kind)) {}
  std::string_view kind() const noexcept override { return kind_; }
  bool fallible_load() const noexcept override { return true; }
  c10::IValue save(const state_filter::mapped_type* /*filter*/, const parameter_names& /*names*/) const override { return save_(); }
  std::string validate(const c10::IValue& /*value*/, bool /*strict*/, const parameter_names& /*names*/) const override { return ""; }
  void load(const c10::IValue& value, bool /*strict*/, const parameter_names& /*names*/) override { load_(value); }

 private:
  std::function<c10::IValue()> save_;
  std::function<void(const c10::IValue&)> load_;
  std::string kind_;
};

}  // namespace

std::shared_ptr<entry_io> module_io(std::shared_ptr<torch::nn::Module> module) {
  return std::make_shared<module_io_impl>(std::move(module));
}
std::shared_ptr<entry_io> optimizer_io(torch::optim::Optimizer& optimizer) {
  return std::make_shared<optimizer_io_impl>(optimizer);
}
std::shared_ptr<entry_io> tensor_io(at::Tensor& tensor) { return std::make_shared<tensor_io_impl>(tensor); }
std::shared_ptr<entry_io> owned_io(c10::IValue value) { return std::make_shared<owned_io_impl>(std::move(value)); }
std::shared_ptr<entry_io> stateful_io(std::function<c10::IValue()> save,
                                          std::function<void(const c10::IValue&)> load, std::string kind) {
  return std::make_shared<stateful_io_impl>(std::move(save), std::move(load), std::move(kind));
}

void parameter_names::add_module(const torch::nn::Module& module) {
  for (const auto& item : module.named_parameters(/*recurse=*/true)) {
    const std::string& name = item.key();
    if (std::find(ambiguous_.begin(), ambiguous_.end(), name) != ambiguous_.end()) continue;
    auto known = parameters_.find(name);
    if (known != parameters_.end()) {
      if (known->second.unsafeGetTensorImpl() == item.value().unsafeGetTensorImpl()) continue;
      names_.erase(known->second.unsafeGetTensorImpl());
      parameters_.erase(known);
      ambiguous_.push_back(name);
      continue;
    }
    parameters_.emplace(name, item.value());
    names_.emplace(item.value().unsafeGetTensorImpl(), name);
  }
}

std::optional<std::string> parameter_names::name_of(const at::Tensor& parameter) const {
  auto it = names_.find(parameter.unsafeGetTensorImpl());
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

const at::Tensor* parameter_names::parameter(std::string_view name) const {
  auto it = parameters_.find(name);
  return it == parameters_.end() ? nullptr : &it->second;
}

}  // namespace detail

void state::erase(std::string_view name) {
  std::erase_if(entries_, [name](const state_entry& entry) { return entry.name() == name; });
}

const state_entry* state::find(std::string_view name) const {
  for (const auto& entry : entries_) {
    if (entry.name() == name) return &entry;
  }
  return nullptr;
}

std::vector<torch::optim::Optimizer*> state::optimizers() const {
  std::vector<torch::optim::Optimizer*> out;
  for (const auto& entry : entries_) {
    if (auto* optimizer = entry.io().optimizer()) out.push_back(optimizer);
  }
  return out;
}

std::vector<const torch::nn::Module*> state::modules() const {
  std::vector<const torch::nn::Module*> out;
  for (const auto& entry : entries_) {
    if (const auto* module = entry.io().module()) out.push_back(module);
  }
  return out;
}

std::vector<std::string> state::names() const {
  std::vector<std::string> out;
  for (const auto& entry : entries_) out.push_back(entry.name());
  return out;
}

const c10::IValue& state::owned_value(std::string_view name) const {
  const auto* entry = find(name);
  if (entry == nullptr) throw std::out_of_range("loom::state has no entry '" + std::string(name) + "'");
  const auto* value = entry->io().owned();
  if (value == nullptr) {
    throw std::logic_error("loom::state entry '" + std::string(name) + "' is a " + std::string(entry->io().kind()) +
                           " held by reference; read the object itself");
  }
  return *value;
}

}  // namespace loom
