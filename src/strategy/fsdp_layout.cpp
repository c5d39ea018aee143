// The sharding engine's layout (fsdp_layout.hpp).
#include "fsdp_layout.hpp"

#include "flat_storage.hpp"

#include <loom/errors.hpp>
#include <loom/strategy/unit.hpp>
#include <loom/strategy/unit_layout.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <typeindex>
#include <unordered_map>

namespace loom::detail {

namespace {

std::string shown_unit(const std::string& name) { return name.empty() ? std::string("<root>") : name; }

// ---------------------------------------------------------------- discovery
struct module_entry {
  std::string name;
  std::shared_ptr<torch::nn::Module> module;
  int parent_module = -1;  // index in the list
  int unit = -1;           // the unit it starts, or -1
  bool is_unit = false;
};

std::string parent_name(const std::string& name) {
  const auto dot = name.rfind('.');
  return dot == std::string::npos ? std::string() : name.substr(0, dot);
}

// Whether auto_wrap_policy makes a unit of m, which holds `unwrapped`
// parameters not yet in a unit below it.
bool policy_chooses(const auto_wrap_policy& policy, const torch::nn::Module& m, const std::string& name,
                    int64_t unwrapped) {
  if (policy.empty()) return false;
  const std::string class_name = m.name();
  const bool torch_class = class_name.rfind("torch::nn::", 0) == 0 && class_name.size() > 15 &&
                           class_name.compare(class_name.size() - 4, 4, "Impl") == 0;
  const std::string short_name = torch_class ? class_name.substr(11, class_name.size() - 15) : class_name;
  return policy.module_types.count(std::type_index(typeid(m))) > 0 || policy.module_names.count(class_name) > 0 ||
         policy.module_names.count(short_name) > 0 ||
         (policy.min_num_params > 0 && unwrapped >= policy.min_num_params) ||
         (policy.predicate && policy.predicate(m, name, unwrapped));
}

// Every module, parents before children, those that are units marked:
// the root, each loom::unit<M>, and what the policy chooses, bottom-up
// (the size policy counts the parameters not yet in a unit below).
std::vector<module_entry> discover(torch::nn::Module& root, const auto_wrap_policy& policy) {
  std::vector<module_entry> modules;
  std::map<std::string, int> index_of;
  for (const auto& item : root.named_modules("", /*include_self=*/true)) {
    module_entry entry{item.key(), item.value()};
    if (!entry.name.empty()) entry.parent_module = index_of.at(parent_name(entry.name));
    index_of[entry.name] = static_cast<int>(modules.size());
    modules.push_back(std::move(entry));
  }
  std::vector<int64_t> unwrapped(modules.size(), 0);
  modules[0].is_unit = true;
  for (std::size_t i = modules.size(); i-- > 1;) {
    const torch::nn::Module& m = *modules[i].module;
    for (const auto& p : m.parameters(/*recurse=*/false)) unwrapped[i] += p.numel();
    modules[i].is_unit =
        dynamic_cast<const unit_marker*>(&m) != nullptr || policy_chooses(policy, m, modules[i].name, unwrapped[i]);
    if (!modules[i].is_unit) unwrapped[static_cast<std::size_t>(modules[i].parent_module)] += unwrapped[i];
  }
  return modules;
}

int innermost_unit_module(const std::vector<module_entry>& modules, int m) {
  while (!modules[static_cast<std::size_t>(m)].is_unit) m = modules[static_cast<std::size_t>(m)].parent_module;
  return m;
}

// A unit per marked module, with its parent unit and activation checkpointing
// (Lightning's activation_checkpointing_policy, or the holder's own flag).
std::vector<std::unique_ptr<sharded_unit>> make_units(std::vector<module_entry>& modules, const fsdp_options& options) {
  std::vector<std::unique_ptr<sharded_unit>> units;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    if (!modules[i].is_unit) continue;
    auto unit = std::make_unique<sharded_unit>();
    unit->name = modules[i].name;
    unit->module = modules[i].module;
    unit->marker = i == 0 ? nullptr : dynamic_cast<unit_marker*>(modules[i].module.get());
    unit->index = static_cast<int>(units.size());
    if (i > 0) {
      const int above = innermost_unit_module(modules, modules[i].parent_module);
      unit->parent = modules[static_cast<std::size_t>(above)].unit;
    }
    const torch::nn::Module& m = *modules[i].module;
    const bool asked = options.activation_checkpointing_types.count(std::type_index(typeid(m))) > 0 ||
                       (unit->marker != nullptr && unit->marker->checkpoints_activations());
    if (asked && (unit->marker == nullptr || !unit->marker->can_checkpoint())) {
      throw configuration_error(
          "fsdp: activation checkpointing of '" + shown_unit(modules[i].name) + "' (" + m.name() +
          ") needs a loom::unit<M> holder whose forward takes tensors and returns one (its forward is "
          "recomputed in backward from its inputs); declare it as a unit, or leave it out of the policy");
    }
    unit->checkpoint = asked;
    modules[i].unit = unit->index;
    units.push_back(std::move(unit));
  }
  return units;
}

// ---------------------------------------------------------------- ownership
struct owner {
  at::Tensor param;
  std::vector<std::string> names;
  std::vector<int> units;  // the unit of each module registering it
};

// Each parameter once, with every name it has and the units using it.
std::vector<owner> find_owners(const std::vector<module_entry>& modules) {
  std::vector<owner> owners;
  std::unordered_map<const void*, std::size_t> owner_of;
  for (std::size_t i = 0; i < modules.size(); ++i) {
    const int unit = modules[static_cast<std::size_t>(innermost_unit_module(modules, static_cast<int>(i)))].unit;
    for (const auto& item : modules[i].module->named_parameters(/*recurse=*/false)) {
      const std::string name = modules[i].name.empty() ? item.key() : modules[i].name + "." + item.key();
      const void* key = item.value().unsafeGetTensorImpl();
      auto found = owner_of.find(key);
      if (found == owner_of.end()) {
        owner_of.emplace(key, owners.size());
        owners.push_back(owner{item.value(), {name}, {unit}});
      } else {
        owners[found->second].names.push_back(name);
        owners[found->second].units.push_back(unit);
      }
    }
  }
  return owners;
}

// The innermost unit that contains every unit using o.
int common_unit(const std::vector<std::unique_ptr<sharded_unit>>& units, const owner& o) {
  auto contains = [&](int outer, int inner) {
    for (; inner >= 0; inner = units[static_cast<std::size_t>(inner)]->parent) {
      if (inner == outer) return true;
    }
    return false;
  };
  int chosen = o.units.front();
  for (int other : o.units) {
    while (!contains(chosen, other)) chosen = units[static_cast<std::size_t>(chosen)]->parent;
  }
  return chosen;
}

void say_tied(const std::vector<std::unique_ptr<sharded_unit>>& units, const owner& o, int chosen) {
  std::string list;
  std::set<int> seen;
  for (int u : o.units) {
    if (!seen.insert(u).second) continue;
    list += (list.empty() ? "" : ", ") + shown_unit(units[static_cast<std::size_t>(u)]->name);
  }
  std::cerr << "loom fsdp: parameter '" << o.names.front() << "' (also '" << o.names.back()
            << "') is used by the units " << list << "; it is flattened once, into "
            << shown_unit(units[static_cast<std::size_t>(chosen)]->name)
            << ", the innermost unit that contains them all\n";
}

// Each unit's parameters in module order, with their offsets in its buffer.
void assign_parameters(std::vector<std::unique_ptr<sharded_unit>>& units, const std::vector<owner>& owners,
                       int rank) {
  for (const auto& o : owners) {
    const int chosen = common_unit(units, o);
    const bool spans_units = std::any_of(o.units.begin(), o.units.end(), [&](int u) { return u != o.units.front(); });
    if (spans_units && rank == 0) say_tied(units, o, chosen);
    sharded_unit& unit = *units[static_cast<std::size_t>(chosen)];
    unit_parameter p;
    p.param = o.param;
    p.names = o.names;
    p.shape = o.param.sizes().vec();
    p.numel = o.param.numel();
    p.offset = unit.numel;
    p.requires_grad = o.param.requires_grad();
    if (!unit.params.empty() && (p.param.scalar_type() != unit.params.front().param.scalar_type() ||
                                 p.param.device() != unit.params.front().param.device())) {
      throw configuration_error("fsdp: unit " + shown_unit(unit.name) + " mixes parameters of dtype/device " +
                                std::string(c10::toString(unit.params.front().param.scalar_type())) + " and " +
                                std::string(c10::toString(p.param.scalar_type())) + " ('" + p.names.front() +
                                "'); a unit's flat buffer has one dtype: wrap them in separate units");
    }
    unit.numel += p.numel;
    unit.params.push_back(std::move(p));
  }
}

// ---------------------------------------------------------------- flattening
// The shard a unit's sharded construction left, when the engine lays the
// unit out as it was cut (FULL_SHARD or HYBRID_SHARD over the same shards,
// this rank's); otherwise the unit is gathered whole now, each parameter
// keeps the part this rank holds (gather_constructed), and setup shards it
// as if it had been built whole: null then, as for a unit built whole.
// Throws configuration_error where the parameters are not the ones it was
// cut from, or were converted to another dtype in between.
const constructed_shard* adopted_shard(const sharded_unit& unit, const fsdp_options& options, int shard, int rank) {
  const constructed_shard* built = unit.marker != nullptr ? unit.marker->constructed() : nullptr;
  if (built == nullptr) return nullptr;
  const std::string refusal = "fsdp: unit " + unit.name + " was sharded as it was built (init_module(true)), but ";
  const std::string remedy = "; build the model outside init_module(true) (each rank then holds it whole until setup)";
  bool same = built->parameters.size() == unit.params.size();
  for (std::size_t i = 0; same && i < unit.params.size(); ++i) {
    same = built->parameters[i] == unit.params[i].param.unsafeGetTensorImpl();
  }
  if (!same) {
    throw configuration_error(refusal + "its parameters at setup are not the ones it was cut from (a weight tied "
                              "to another unit, parameters added after its constructor, or a wrap policy that "
                              "makes units inside it)" + remedy);
  }
  if (!unit.params.empty() && built->shard.scalar_type() != unit.params.front().param.scalar_type()) {
    throw configuration_error(refusal + "in " + std::string(c10::toString(built->shard.scalar_type())) +
                              ", and its parameters are " +
                              std::string(c10::toString(unit.params.front().param.scalar_type())) +
                              " at setup (converted in between)" + remedy);
  }
  const bool cut_alike =
      (options.strategy == sharding_strategy::full_shard || options.strategy == sharding_strategy::hybrid_shard) &&
      built->shards == shard && built->rank == rank && built->numel == unit.numel;
  if (cut_alike) return built;
  std::vector<at::Tensor> parameters;
  for (const auto& p : unit.params) parameters.push_back(p.param);
  gather_constructed(*unit.marker, parameters);
  return nullptr;
}

// Each parameter's view of a shard-sized gradient buffer.
void cut_grad_shard_views(sharded_unit& unit, const flat_shard& layout, const at::Tensor& buffer) {
  for (auto& p : unit.params) {
    const auto [begin, end] = layout.part(p.offset, p.numel);
    p.grad_shard_view = buffer.narrow(0, begin - layout.begin(), end - begin);
  }
}

// The flat buffer with the unit's values (rank 0's where sync_module_states),
// or, for a unit sharded at construction, only a storage for its views.
at::Tensor flat_values(sharded_unit& unit, const fsdp_options& options, comm::process_group& world, bool built) {
  const auto options_of = unit.params.front().param.options().requires_grad(false);
  if (built) return at::empty({unit.padded}, options_of);
  at::Tensor flat = at::zeros({unit.padded}, options_of);
  for (auto& p : unit.params) flat.narrow(0, p.offset, p.numel).copy_(p.param.detach().reshape({-1}));
  if (options.sync_module_states && world.valid()) world.broadcast(flat, 0);
  return flat;
}

// Each parameter's views of the buffers, and the parameter re-pointed at its
// shard (the module's own copy of it goes now).
void point_parameters_at_shard(sharded_unit& unit, const flat_shard& layout) {
  for (auto& p : unit.params) {
    p.full_view = alias(unit.full, p.offset, p.shape);
    if (layout.shards > 1) {
      const auto [begin, end] = layout.part(p.offset, p.numel);
      p.local_offset = begin;
      p.shard_view = unit.shard.narrow(0, begin - layout.begin(), end - begin);
    } else {
      p.local_offset = p.offset;
      p.shard_view = p.full_view;  // nothing sharded: the parameter keeps its shape
    }
    // AccumulateGrad is made while the parameter is full-sized and kept alive here.
    p.param.set_data(p.full_view);
    p.param.mutable_grad().reset();
    if (p.requires_grad) {
      p.accumulator = torch::autograd::impl::grad_accumulator(p.param);
      ++unit.grads_expected;
    }
    p.param.set_data(p.shard_view);
  }
}

// The gradient buffers. Sharded: made while no other unit-sized buffer is
// allocated (setup's peak is the model, one unit, and the shards), emptied
// until the first backward; ZeRO-1 (keep_full_gradients) keeps the full one,
// its shard being its own chunk. Unsharded: the gradient buffer is the shard.
void make_gradient_buffers(sharded_unit& unit, const flat_shard& layout, const fsdp_options& options) {
  const auto options_of = unit.shard.options();
  if (layout.shards == 1) {
    unit.grad_shard = unit.full_grad = at::zeros({unit.padded}, options_of);
    for (auto& p : unit.params) p.grad_view = alias(unit.full_grad, p.offset, p.shape);
    for (auto& p : unit.params) p.grad_shard_view = p.grad_view;
    return;
  }
  unit.full_grad = at::empty({unit.padded}, options_of);
  for (auto& p : unit.params) p.grad_view = alias(unit.full_grad, p.offset, p.shape);
  if (options.keep_full_gradients) {
    unit.full_grad.zero_();
    unit.grad_shard = unit.full_grad.narrow(0, layout.begin(), unit.shard_numel);
    unit.grad_shard_pending = false;
    cut_grad_shard_views(unit, layout, unit.grad_shard);
  } else {
    free_storage(unit.full_grad);
  }
}

void flatten(sharded_unit& unit, const fsdp_options& options, const fsdp_comm& comm, comm::process_group& world,
             int& partitions) {
  const flat_shard layout{unit.numel, comm.shard_size(), comm.shard_rank()};
  unit.padded = layout.padded();
  unit.shard_numel = layout.shard_numel();
  if (!unit.params.empty()) unit.partition = partitions++;
  const constructed_shard* built = adopted_shard(unit, options, comm.shard_size(), comm.shard_rank());
  if (unit.params.empty()) {
    unit.shard = at::empty({0});
    unit.full = unit.grad_shard = unit.full_grad = unit.reduced = unit.shard;
    unit.sharding = sharded_state::gathered;
    return;
  }
  const bool sharded = layout.shards > 1;
  if (sharded) {
    // The gradient shard's storage waits for the first backward; made, its
    // views cut, and emptied before the flat buffer exists, so setup's peak
    // never holds both.
    unit.grad_shard = at::empty({unit.shard_numel}, unit.params.front().param.options().requires_grad(false));
    cut_grad_shard_views(unit, layout, unit.grad_shard);
    free_storage(unit.grad_shard);
    unit.grad_shard_pending = true;
  }
  const at::Tensor flat = flat_values(unit, options, world, built != nullptr);
  // SHARD_GRAD_OP (ZeRO-2) keeps the whole flat buffer: its shard is its own
  // chunk, which the optimizer updates in place, and the gather before the
  // next forward fills the other chunks (4Ψ + 12Ψ/N).
  const bool keeps_full = options.strategy == sharding_strategy::shard_grad_op;
  unit.full = flat;
  unit.shard = sharded ? flat.narrow(0, layout.begin(), unit.shard_numel) : flat;
  if (built != nullptr) unit.shard = built->shard;
  else if (sharded && !keeps_full) unit.shard = unit.shard.clone();
  if (unit.marker != nullptr) unit.marker->set_constructed(nullptr);
  point_parameters_at_shard(unit, layout);
  if (sharded && !keeps_full) free_storage(unit.full);
  make_gradient_buffers(unit, layout, options);
  unit.sharding = sharded ? sharded_state::sharded : sharded_state::gathered;
}

}  // namespace

std::vector<std::unique_ptr<sharded_unit>> lay_out_units(torch::nn::Module& root, const fsdp_options& options,
                                                         fsdp_comm& comm, comm::process_group& world) {
  auto modules = discover(root, options.wrap_policy);
  auto units = make_units(modules, options);
  assign_parameters(units, find_owners(modules), world.rank());
  at::NoGradGuard no_grad;
  int partitions = 0;
  for (auto& unit : units) flatten(*unit, options, comm, world, partitions);
  return units;
}

}  // namespace loom::detail
