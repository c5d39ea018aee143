#include <loom/strategy/unit_construction.hpp>

#include <loom/comm/process_group.hpp>
#include <loom/strategy/unit.hpp>
#include <loom/strategy/unit_layout.hpp>

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>

#include <algorithm>
#include <limits>
#include <memory>

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
    if (p.storage().nbytes() < static_cast<std::size_t>(p.numel()) * p.element_size()) return;
  }
  comm::process_group& group = *sharding->group;
  auto built = std::make_shared<constructed_shard>();
  built->shards = group.size();
  built->rank = group.rank();
  for (const auto& p : parameters) built->numel += p.numel();
  const std::int64_t padded = (built->numel + built->shards - 1) / built->shards * built->shards;
  const std::int64_t shard_numel = padded / built->shards;
  const std::int64_t begin = built->rank * shard_numel;
  const std::int64_t end = begin + shard_numel;
  const auto options = parameters.front().options().requires_grad(false);
  built->shard = at::zeros({shard_numel}, options);
  // A placeholder of each shape over one NaN: no storage of the parameter's size.
  const at::Tensor nan = at::full({1}, std::numeric_limits<double>::quiet_NaN(), options);
  at::NoGradGuard no_grad;
  std::int64_t offset = 0;
  for (at::Tensor p : parameters) {
    at::Tensor values = p.detach();
    if (sharding->from_rank_zero) group.broadcast(values, 0);
    const std::int64_t from = std::clamp(offset, begin, end);
    const std::int64_t to = std::clamp(offset + p.numel(), begin, end);
    if (to > from) {
      built->shard.narrow(0, from - begin, to - from).copy_(values.reshape({-1}).narrow(0, from - offset, to - from));
    }
    built->parameters.push_back(p.unsafeGetTensorImpl());
    offset += p.numel();
    p.set_data(nan.expand(p.sizes()));
  }
  marker.set_constructed(std::move(built));
}

}  // namespace loom::detail
