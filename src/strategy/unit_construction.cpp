#include <loom/strategy/unit_construction.hpp>

#include <loom/comm/process_group.hpp>
#include <loom/errors.hpp>
#include <loom/strategy/unit.hpp>
#include <loom/strategy/unit_layout.hpp>
#include <loom/tp/layers.hpp>
#include <loom/tp/parallelize.hpp>
#include <loom/util/placeholder.hpp>

#include <ATen/ops/empty.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/util/accumulate.h>
#include <torch/nn/module.h>

#include <limits>
#include <memory>
#include <unordered_map>

namespace loom::detail {

namespace {

thread_local const construction_sharding* active_sharding = nullptr;

}  // namespace

construction_scope::construction_scope(const construction_sharding* sharding) noexcept
    : sharding_(sharding != nullptr ? *sharding : construction_sharding{}), previous_(active_sharding) {
  if (sharding != nullptr) active_sharding = &sharding_;
}

construction_scope::~construction_scope() { active_sharding = previous_; }

void unit_constructed(torch::nn::Module& unit, unit_marker& marker) {
  const construction_sharding* sharding = active_sharding;
  if (sharding == nullptr || sharding->group == nullptr) return;
  const std::vector<at::Tensor> parameters = unit_parameters(unit).front();
  if (parameters.empty()) return;
  // One flat buffer has one dtype and device: a unit mixing them is left
  // whole, and setup says why it cannot be sharded. So is a unit that
  // registers another unit's parameter (already a placeholder, smaller than
  // its shape): setup finds the tie and refuses.
  for (const auto& p : parameters) {
    if (p.scalar_type() != parameters.front().scalar_type() || p.device() != parameters.front().device()) return;
    if (is_placeholder(p)) return;
  }
  comm::process_group& group = *sharding->group;
  auto built = std::make_shared<constructed_shard>();
  built->shards = group.size();
  built->rank = group.rank();
  built->group = sharding->group;
  for (const auto& p : parameters) {
    built->numel += p.numel();
    built->shapes.push_back(p.sizes().vec());
  }
  built->kept.resize(parameters.size());
  const flat_shard layout{built->numel, built->shards, built->rank};
  auto options = parameters.front().options().requires_grad(false);
  if (sharding->dtype && parameters.front().is_floating_point()) options = options.dtype(*sharding->dtype);
  built->shard = at::zeros({layout.shard_numel()}, options);
  // A placeholder of each shape over one NaN: no storage of the parameter's size.
  const at::Tensor nan = at::full({1}, std::numeric_limits<double>::quiet_NaN(), options);
  at::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (at::Tensor p : parameters) {
    at::Tensor values = p.detach();
    if (sharding->from_rank_zero) group.broadcast(values, 0);
    const auto [from, to] = layout.part(offset, p.numel());
    if (to > from) {
      built->shard.narrow(0, from - layout.begin(), to - from)
          .copy_(values.reshape({-1}).narrow(0, from - offset, to - from));
    }
    built->parameters.push_back(p.unsafeGetTensorImpl());
    offset += p.numel();
    p.set_data(nan.expand(p.sizes()));
  }
  marker.set_constructed(std::move(built));
}

void gather_constructed(unit_marker& marker, const std::vector<at::Tensor>& parameters) {
  const constructed_shard* built = marker.constructed();
  if (built == nullptr) return;
  if (built->group == nullptr || parameters.size() != built->parameters.size()) {
    throw configuration_error("init_module(true): a unit's parameters at setup are not the ones it was cut from; "
                              "build the model outside init_module(true)");
  }
  const flat_shard layout{built->numel, built->shards, built->rank};
  at::Tensor full = at::empty({layout.padded()}, built->shard.options());
  built->group->all_gather_into(full, built->shard).wait();
  at::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    at::Tensor p = parameters[i];
    const auto& shape = built->shapes[i];
    const std::int64_t numel = c10::multiply_integers(shape);
    at::Tensor value = full.narrow(0, offset, numel).view(shape);
    const kept_chunk& kept = built->kept[i];
    if (kept.parts > 1) value = value.chunk(kept.parts, kept.dim)[kept.part];
    // Its own contiguous storage (the gathered unit goes after this loop).
    p.set_data(value.to(p.scalar_type(), /*non_blocking=*/false, /*copy=*/true, at::MemoryFormat::Contiguous));
    offset += numel;
  }
  marker.set_constructed(nullptr);
}

void note_tensor_parallel_chunks(torch::nn::Module& module) {
  std::unordered_map<const void*, kept_chunk> chunks;
  for (const tp::layer_marker* layer : tp::parallelized_layers(module)) {
    for (const auto& sharded : layer->sharded_parameters()) {
      const std::int64_t rank = std::max<std::int64_t>(1, sharded.value.dim());
      chunks[sharded.value.unsafeGetTensorImpl()] =
          kept_chunk{(sharded.dim % rank + rank) % rank, sharded.group.size(), sharded.group.rank()};
    }
  }
  if (chunks.empty()) return;
  for (const auto& child : module.modules(/*include_self=*/true)) {
    auto* marker = dynamic_cast<unit_marker*>(child.get());
    constructed_shard* built = marker != nullptr ? marker->constructed() : nullptr;
    if (built == nullptr) continue;
    for (std::size_t i = 0; i < built->parameters.size(); ++i) {
      if (const auto found = chunks.find(built->parameters[i]); found != chunks.end()) built->kept[i] = found->second;
    }
  }
}

void gather_all_constructed(torch::nn::Module& module) {
  for (const auto& child : module.modules(/*include_self=*/true)) {
    auto* marker = dynamic_cast<unit_marker*>(child.get());
    if (marker != nullptr && marker->constructed() != nullptr) {
      gather_constructed(*marker, unit_parameters(*child).front());
    }
  }
}

}  // namespace loom::detail
