// torch.optim's state_dict layout for LibTorch's optimizers
// (optimizer_state.hpp): one table per family names its options and
// per-parameter state as torch.optim does; one engine reads and writes them.
#include "optimizer_state.hpp"

#include "../util/optimizer_families.hpp"

#include <loom/checkpoint/io.hpp>
#include <loom/compat.hpp>

#include <ATen/ATen.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <optional>
#include <sstream>
#include <stdexcept>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

namespace loom {
namespace {
thread_local std::optional<at::ScalarType> state_dtype_override;
}  // namespace

optimizer_state_dtype::optimizer_state_dtype(at::ScalarType dtype) : previous_(state_dtype_override) {
  state_dtype_override = dtype;
}
optimizer_state_dtype::~optimizer_state_dtype() { state_dtype_override = previous_; }

}  // namespace loom

namespace loom::detail {
namespace {

std::vector<std::vector<at::Tensor>> groups_of(torch::optim::Optimizer& optimizer) {
  std::vector<std::vector<at::Tensor>> groups;
  for (auto& group : optimizer.param_groups()) groups.push_back(group.params());
  return groups;
}

// Name keys when every parameter has a name, else positions (torch.optim's own keys).
bool all_named(torch::optim::Optimizer& optimizer, const parameter_names& names) {
  for (const auto& group : groups_of(optimizer)) {
    for (const auto& parameter : group) {
      if (!names.name_of(parameter)) return false;
    }
  }
  return true;
}

double number(const c10::IValue& value) { return value.isInt() ? static_cast<double>(value.toInt()) : value.toDouble(); }
bool is_number(const c10::IValue& value) { return value.isInt() || value.isDouble(); }
bool is_pair(const c10::IValue& value) {
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    return elements.size() == 2 && is_number(elements[0]) && is_number(elements[1]);
  }
  if (value.isList()) {
    const auto list = value.toListRef();
    return list.size() == 2 && is_number(list[0]) && is_number(list[1]);
  }
  return false;
}
betas_t pair_of(const c10::IValue& value) {
  if (value.isTuple()) {
    const auto& elements = value.toTupleRef().elements();
    return {number(elements[0]), number(elements[1])};
  }
  const auto list = value.toListRef();
  return {number(list[0]), number(list[1])};
}

// A saved step as torch.optim writes one (a number or a one-element
// tensor), or nullopt when it is no count 0 to 2^53: a larger one, or NaN,
// would make the conversion undefined (found by fuzzing:
// tests/fuzz/corpus/load/regression_step_*).
std::optional<std::int64_t> step_count(const c10::IValue& saved) {
  double count = 0;
  if (saved.isTensor()) {
    if (saved.toTensor().numel() != 1) return std::nullopt;
    count = saved.toTensor().item<double>();
  } else if (saved.isInt() || saved.isDouble()) {
    count = number(saved);
  } else {
    return std::nullopt;
  }
  if (!(count >= 0 && count <= 9007199254740992.0)) return std::nullopt;
  return static_cast<std::int64_t>(count);
}

std::string key_text(const c10::IValue& key) {
  return key.isString() ? "'" + key.toStringRef() + "'" : key.isInt() ? std::to_string(key.toInt()) : key.tagKind();
}

// The saved key of each parameter, group by group, mapped to this
// optimizer's parameter: by name when the name is one of this group's
// parameters, else by position in the group (torch.optim's rule).
struct key_map {
  std::vector<std::pair<c10::IValue, at::Tensor>> entries;
  std::string problem;
};
key_map map_keys(const c10::IValue& value, torch::optim::Optimizer& optimizer, const parameter_names& names) {
  key_map mapped;
  const auto groups = groups_of(optimizer);
  const auto saved_groups = value.toGenericDict().at("param_groups").toListRef();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto params = saved_groups[g].toGenericDict().at("params").toListRef();
    for (std::size_t k = 0; k < params.size(); ++k) {
      const c10::IValue& key = params[k];
      at::Tensor target = groups[g][k];
      if (key.isString()) {
        if (const at::Tensor* named = names.parameter(key.toStringRef())) {
          bool in_group = false;
          for (const auto& p : groups[g]) in_group = in_group || p.unsafeGetTensorImpl() == named->unsafeGetTensorImpl();
          if (in_group) target = *named;
        }
      }
      mapped.entries.emplace_back(key, target);
    }
  }
  return mapped;
}

template <class Family>
c10::IValue to_dict(const Family& family, torch::optim::Optimizer& optimizer, const parameter_names& names) {
  using options_type = typename Family::options_type;
  using state_type = typename Family::state_type;
  const bool named = all_named(optimizer, names);
  c10::impl::GenericDict state(named ? c10::TypePtr(c10::StringType::get()) : c10::TypePtr(c10::IntType::get()),
                               c10::AnyType::get());
  c10::impl::GenericList groups(c10::AnyType::get());
  std::int64_t position = 0;
  for (auto& group : optimizer.param_groups()) {
    auto& options = static_cast<options_type&>(group.options());
    c10::impl::GenericDict saved(c10::StringType::get(), c10::AnyType::get());
    for (const auto& [key, field] : family.numbers) saved.insert(key, field(options));
    if (family.betas != nullptr) {
      const auto [beta1, beta2] = family.betas(options);
      saved.insert("betas", c10::ivalue::Tuple::create({beta1, beta2}));
    }
    for (const auto& [key, field] : family.flags) saved.insert(key, field(options));
    c10::impl::GenericList params(c10::AnyType::get());
    for (const auto& parameter : group.params()) {
      const c10::IValue key = named ? c10::IValue(*names.name_of(parameter)) : c10::IValue(position);
      ++position;
      params.push_back(key);
      auto found = optimizer.state().find(compat::optimizer_state_key(parameter));
      if (found == optimizer.state().end()) continue;
      auto& per_parameter = static_cast<state_type&>(*found->second);
      c10::impl::GenericDict entry(c10::StringType::get(), c10::AnyType::get());
      if (family.step != nullptr) {
        entry.insert("step", at::scalar_tensor(static_cast<double>(family.step(per_parameter)), at::kFloat));
      }
      for (const auto& [name, field] : family.tensors) {
        if (field(per_parameter).defined()) entry.insert(name, field(per_parameter).detach());
      }
      state.insert(key, entry);
    }
    saved.insert("params", params);
    groups.push_back(saved);
  }
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("state", state);
  dict.insert("param_groups", groups);
  return dict;
}

template <class Family>
std::string check(const Family& family, const c10::IValue& value, torch::optim::Optimizer& optimizer,
                  const parameter_names& names) {
  const auto dict = value.toGenericDict();
  if (!dict.contains("state") || !dict.contains("param_groups") || !dict.at("param_groups").isList() ||
      !dict.at("state").isGenericDict()) {
    return "expected torch.optim's layout (a dict with 'state' and 'param_groups'), found another dict";
  }
  const auto saved_groups = dict.at("param_groups").toListRef();
  const auto groups = groups_of(optimizer);
  if (saved_groups.size() != groups.size()) {
    return "the checkpoint has " + std::to_string(saved_groups.size()) + " param group(s), the optimizer has " +
           std::to_string(groups.size());
  }
  std::string needs;
  for (const auto& [key, field] : family.numbers) needs += (needs.empty() ? "" : ", ") + key;
  if (family.betas != nullptr) needs += ", betas";
  for (const auto& [key, field] : family.flags) needs += ", " + key;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string where = "param group " + std::to_string(g);
    if (!saved_groups[g].isGenericDict()) return where + " is not a dict";
    const auto saved = saved_groups[g].toGenericDict();
    auto missing = [&](const std::string& key) {
      return where + " lacks '" + key + "' or has the wrong type (a " + std::string(family.type) + " reads " + needs +
             "): is this another optimizer's state?";
    };
    for (const auto& [key, field] : family.numbers) {
      if (!saved.contains(key) || !is_number(saved.at(key))) return missing(key);
    }
    if (family.betas != nullptr && (!saved.contains("betas") || !is_pair(saved.at("betas")))) return missing("betas");
    for (const auto& [key, field] : family.flags) {
      if (!saved.contains(key) || !saved.at(key).isBool()) return missing(key);
    }
    if (!saved.contains("params") || !saved.at("params").isList()) return where + " has no 'params' list";
    const auto params = saved.at("params").toListRef();
    if (params.size() != groups[g].size()) {
      return where + " has " + std::to_string(params.size()) + " parameter(s) in the checkpoint, " +
             std::to_string(groups[g].size()) + " in the optimizer";
    }
    for (const auto& key : params) {
      if (!key.isString() && !key.isInt()) return where + " names a parameter by a " + key.tagKind();
    }
  }
  const key_map mapped = map_keys(value, optimizer, names);
  for (const auto& item : dict.at("state").toGenericDict()) {
    const c10::IValue& key = item.key();
    const at::Tensor* target = nullptr;
    for (const auto& [saved_key, parameter] : mapped.entries) {
      if (saved_key == key) target = &parameter;
    }
    if (target == nullptr) return "'state' has an entry for " + key_text(key) + ", which no param group lists";
    if (!item.value().isGenericDict()) return "the state of " + key_text(key) + " is not a dict";
    const auto entry = item.value().toGenericDict();
    if (auto step = entry.find("step"); family.step != nullptr && step != entry.end() && !step_count(step->value())) {
      return "the state of " + key_text(key) + " has a step that is not a step count (0 to 2^53)";
    }
    for (const auto& [name, field] : family.tensors) {
      auto it = entry.find(name);
      if (it == entry.end() || it->value().isNone()) continue;
      if (!it->value().isTensor()) return "the state '" + name + "' of " + key_text(key) + " is not a tensor";
      if (it->value().toTensor().sizes() != target->sizes()) {
        std::ostringstream out;
        out << "the state '" << name << "' of " << key_text(key) << " has shape " << it->value().toTensor().sizes()
            << ", its parameter " << target->sizes();
        return out.str();
      }
    }
    if (family.step != nullptr) {
      auto it = entry.find("step");
      if (it != entry.end() && !(is_number(it->value()) || (it->value().isTensor() && it->value().toTensor().numel() == 1))) {
        return "the 'step' of " + key_text(key) + " is neither a number nor a one-element tensor";
      }
    }
  }
  return "";
}

template <class Family>
void load(const Family& family, const c10::IValue& value, torch::optim::Optimizer& optimizer,
          const parameter_names& names) {
  using options_type = typename Family::options_type;
  using state_type = typename Family::state_type;
  const auto dict = value.toGenericDict();
  const auto saved_groups = dict.at("param_groups").toListRef();
  auto& groups = optimizer.param_groups();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const auto saved = saved_groups[g].toGenericDict();
    auto& options = static_cast<options_type&>(groups[g].options());
    for (const auto& [key, field] : family.numbers) field(options) = number(saved.at(key));
    if (family.betas != nullptr) family.betas(options) = pair_of(saved.at("betas"));
    for (const auto& [key, field] : family.flags) field(options) = saved.at(key).toBool();
  }
  const key_map mapped = map_keys(value, optimizer, names);
  const auto saved_state = dict.at("state").toGenericDict();
  for (const auto& [key, parameter] : mapped.entries) {
    const auto slot = compat::optimizer_state_key(parameter);
    auto found = saved_state.find(key);
    if (found == saved_state.end()) {
      optimizer.state().erase(slot);
      continue;
    }
    const auto entry = found->value().toGenericDict();
    // The state this replaces: a field read in place into it is kept as it is.
    auto* const previous = optimizer.state().count(slot) != 0
                               ? dynamic_cast<state_type*>(optimizer.state().at(slot).get())
                               : nullptr;
    auto made = std::make_unique<state_type>();
    if (family.step != nullptr) {
      if (auto step = entry.find("step"); step != entry.end()) {
        const c10::IValue& saved_step = step->value();
        const auto count = step_count(saved_step);
        if (!count) throw std::invalid_argument("the state of " + key_text(key) + " has a step that is not a step count");
        family.step(*made) = *count;
      }
    }
    for (const auto& [name, field] : family.tensors) {
      auto it = entry.find(name);
      if (it == entry.end() || it->value().isNone()) continue;
      // torch.optim casts state to the parameter's dtype and device; so does loom.
      // (Under optimizer_state_dtype, floating state takes that dtype instead.)
      const at::Tensor saved = it->value().toTensor();
      auto options = parameter.options();
      if (state_dtype_override.has_value() && saved.is_floating_point()) options = options.dtype(*state_dtype_override);
      // The state's own tensor, read into in place (a rank's load of its
      // parts) and of the state's dtype and device, is kept; any other is
      // copied, so no two states share memory.
      const bool in_place = previous != nullptr && field(*previous).defined() && field(*previous).is_same(saved) &&
                            saved.scalar_type() == c10::typeMetaToScalarType(options.dtype()) &&
                            saved.device() == options.device();
      field(*made) = in_place ? saved : saved.to(options, /*non_blocking=*/false, /*copy=*/true);
    }
    optimizer.state()[slot] = std::move(made);
  }
}

}  // namespace

bool has_torch_optim_layout(torch::optim::Optimizer& optimizer) {
  return with_family(optimizer, [](const auto&) {});
}

c10::IValue optimizer_to_dict(torch::optim::Optimizer& optimizer, const parameter_names& names) {
  c10::IValue out;
  with_family(optimizer, [&](const auto& family) { out = to_dict(family, optimizer, names); });
  return out;
}

std::string check_optimizer_dict(const c10::IValue& value, torch::optim::Optimizer& optimizer,
                                 const parameter_names& names) {
  std::string problem;
  with_family(optimizer, [&](const auto& family) { problem = check(family, value, optimizer, names); });
  return problem;
}

void load_optimizer_dict(const c10::IValue& value, torch::optim::Optimizer& optimizer, const parameter_names& names) {
  with_family(optimizer, [&](const auto& family) { load(family, value, optimizer, names); });
}

}  // namespace loom::detail
