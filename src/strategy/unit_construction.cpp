#include <loom/strategy/unit_construction.hpp>

#include <loom/comm/process_group.hpp>
#include <loom/strategy/unit.hpp>
#include <loom/strategy/unit_layout.hpp>

#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <torch/nn/module.h>

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

}  // namespace loom::detail
