// The placements of a set-up model, and the one full-state scope over them
// (full_state.hpp).
#include <loom/errors.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/full_state.hpp>
#include <loom/strategy/live_engines.hpp>
#include <loom/tp/layers.hpp>
#include <loom/tp/parallelize.hpp>

#include "../util/optimizer_families.hpp"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>

#include <algorithm>
#include <map>
#include <unordered_map>

namespace loom::detail {


std::vector<placement> placements_of(const std::vector<std::weak_ptr<fsdp_engine>>& engines,
                                     const std::vector<const torch::nn::Module*>& modules) {
  std::vector<placement> placed;
  std::unordered_map<const void*, std::size_t> index;
  std::vector<const torch::nn::Module*> roots;
  auto add_root = [&](const torch::nn::Module* module) {
    if (std::find(roots.begin(), roots.end(), module) == roots.end()) roots.push_back(module);
  };
  for (const auto& engine : lock_live(engines)) {
    for (auto& where : engine->placements()) {
      if (index.emplace(where.parameter.unsafeGetTensorImpl(), placed.size()).second) placed.push_back(std::move(where));
    }
    add_root(&engine->module());
  }
  for (const torch::nn::Module* module : modules) add_root(module);
  for (const torch::nn::Module* root : roots) {
    for (const auto& parameter : root->parameters()) {
      if (index.emplace(parameter.unsafeGetTensorImpl(), placed.size()).second) {
        placed.push_back({.parameter = parameter, .local = parameter.detach(), .shape = parameter.sizes().vec()});
      }
    }
  }
  // Tensor parallel chunks what the engine (if any) then slices.
  for (const torch::nn::Module* root : roots) {
    for (const tp::layer_marker* layer : tp::parallelized_layers(*root)) {
      for (const auto& chunk : layer->sharded_parameters()) {
        auto found = index.find(chunk.value.unsafeGetTensorImpl());
        if (found == index.end()) continue;
        placement& where = placed[found->second];
        if (where.dim >= 0) continue;  // reached from two roots
        where.dim = chunk.dim;
        where.chunk_group = chunk.group;
        where.shape[static_cast<std::size_t>(chunk.dim)] *= chunk.group.size();
      }
    }
  }
  return placed;
}

namespace {

// The engines' shards stay in memory for the scope (a shard store's are
// read in), and the parameters point at their shards again after it.
struct engines_in_scope {
  std::vector<std::shared_ptr<fsdp_engine>> live;
  bool changed = false;
  explicit engines_in_scope(std::vector<std::shared_ptr<fsdp_engine>> engines) : live(std::move(engines)) {
    for (auto& engine : live) engine->pin_shards();
  }
  ~engines_in_scope() {
    for (auto& engine : live) engine->after_full_state(changed);
  }
};

// A per-parameter optimizer state tensor holding the same elements as its
// parameter's local part.
struct state_slot {
  at::Tensor* value;
  const placement* where;
  at::Tensor original;
  at::Tensor full;
};

// A sharded optimizer's state is gathered, sliced and read in parts by its
// layout: an optimizer of another kind is refused (its own archive would
// hold this rank's part as if it were the whole).
void require_state_layouts(const std::vector<torch::optim::Optimizer*>& optimizers, bool any_split, bool loading) {
  for (torch::optim::Optimizer* optimizer : optimizers) {
    if (any_split && (loading || !optimizer->state().empty()) && !fsdp_engine::knows_state_layout(*optimizer)) {
      throw configuration_error(
          std::string("a ") + (loading ? "load into" : "full checkpoint of") + " a sharded optimizer's state needs "
          "its layout (SGD, Adam, AdamW, RMSprop and Adagrad are known); " +
          (loading ? "use one of those" : "save a sharded checkpoint instead, or use one of those"));
    }
  }
}

std::vector<state_slot> state_slots(const std::vector<torch::optim::Optimizer*>& optimizers,
                                    const std::unordered_map<const void*, const placement*>& where_of, bool any_split) {
  require_state_layouts(optimizers, any_split, /*loading=*/false);
  std::vector<state_slot> slots;
  for (torch::optim::Optimizer* optimizer : optimizers) {
    for_each_state_tensor(*optimizer, [&](const at::Tensor& parameter, std::string_view, at::Tensor& value) {
      auto found = where_of.find(parameter.unsafeGetTensorImpl());
      if (found == where_of.end() || !value.defined() || value.dim() == 0) return;  // a scalar (step)
      if (value.numel() != found->second->local.numel()) return;
      slots.push_back({&value, found->second, value, {}});
    });
  }
  return slots;
}

}  // namespace

void with_full_state(const std::vector<std::weak_ptr<fsdp_engine>>& engines,
                     const std::vector<const torch::nn::Module*>& modules,
                     const std::vector<torch::optim::Optimizer*>& optimizers, bool keeps,
                     const std::function<void()>& body) {
  at::NoGradGuard no_grad;
  engines_in_scope scope(lock_live(engines));
  std::vector<placement> placed;
  for (auto& where : placements_of(engines, modules)) {
    if (where.split() || where.engine_owned) placed.push_back(std::move(where));
  }
  std::unordered_map<const void*, const placement*> where_of;
  for (const auto& where : placed) where_of.emplace(where.parameter.unsafeGetTensorImpl(), &where);

  // Gathered one at a time in the records' order (every rank's); a rank that
  // does not keep drops each at once.
  std::vector<at::Tensor> full(placed.size());
  for (std::size_t i = 0; i < placed.size(); ++i) {
    at::Tensor gathered = gather_full(placed[i], placed[i].local);
    if (keeps) full[i] = placed[i].split() ? gathered : gathered.clone();  // unsplit: a view of the shard
  }
  const bool any_split = std::any_of(placed.begin(), placed.end(), [](const placement& p) { return p.split(); });
  std::vector<state_slot> slots = state_slots(optimizers, where_of, any_split);
  for (auto& slot : slots) {
    at::Tensor gathered = gather_full(*slot.where, slot.original);
    if (keeps) slot.full = slot.where->split() ? gathered : gathered.clone();
  }

  if (keeps) {
    for (std::size_t i = 0; i < placed.size(); ++i) placed[i].parameter.set_data(full[i]);
    for (auto& slot : slots) *slot.value = slot.full;
  }
  auto restore = [&] {
    for (const auto& where : placed) where.parameter.set_data(where.local);
    for (auto& slot : slots) *slot.value = slot.original;
  };
  try {
    body();
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

namespace {

// This rank's parts of target's split (or engine-owned) parameters, by name,
// with their placements; each parameter is set to its part (what it is
// between steps, and where a load writes).
struct named_parts {
  rank_parts mine;
  std::map<std::string, placement> where;
};
named_parts parts_of(const std::vector<std::weak_ptr<fsdp_engine>>& engines, const state& target, bool loading) {
  std::unordered_map<const void*, placement> by_parameter;
  bool any_split = false;
  for (auto& where : placements_of(engines, target.modules())) {
    if (!where.split() && !where.engine_owned) continue;
    any_split = any_split || where.split();
    where.parameter.set_data(where.local);
    by_parameter.emplace(where.parameter.unsafeGetTensorImpl(), std::move(where));
  }
  require_state_layouts(target.optimizers(), any_split, loading);
  named_parts out;
  for (const torch::nn::Module* module : target.modules()) {
    for (const auto& item : module->named_parameters()) {
      auto found = by_parameter.find(item.value().unsafeGetTensorImpl());
      if (found == by_parameter.end()) continue;
      const placement& where = found->second;
      shard_range range = save_range(where).value_or(shard_range{0, where.chunk_numel(), where.shape});
      out.mine.emplace(item.key(), rank_part{std::move(range), where.local.sizes().vec()});
      out.where.emplace(item.key(), where);
    }
  }
  return out;
}

}  // namespace

state load_local_state(const std::vector<std::weak_ptr<fsdp_engine>>& engines, const state& target,
                       const std::string& path, bool strict, comm::process_group& group) {
  at::NoGradGuard no_grad;
  engines_in_scope scope(lock_live(engines));
  state rest = load_local_parts(path, target, parts_of(engines, target, /*loading=*/true).mine, strict, group);
  scope.changed = true;
  return rest;
}

void save_gathered_state(const std::vector<std::weak_ptr<fsdp_engine>>& engines, const state& target,
                         const state_filter& filter, const checkpoint_metadata& metadata, const std::string& path,
                         int root, comm::process_group& group) {
  at::NoGradGuard no_grad;
  engines_in_scope scope(lock_live(engines));
  const named_parts parts = parts_of(engines, target, /*loading=*/false);
  save_gathered_checkpoint(
      path, target, filter, metadata, parts.mine,
      [&parts](const std::string& name, const at::Tensor& part) { return gather_full(parts.where.at(name), part); },
      !group.valid() || group.rank() == root);
}

}  // namespace loom::detail
