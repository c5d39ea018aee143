// The sharding engine's communication context (fsdp_comm.hpp).
#include "fsdp_comm.hpp"

#include "flat_storage.hpp"

#include <loom/comm/device_mesh.hpp>
#include <loom/errors.hpp>

#include <ATen/ATen.h>

#include <algorithm>
#include <string>

namespace loom::detail {

namespace {

// The mesh (replicate, shard) a sharding strategy asks of world_size ranks.
std::pair<int, int> mesh_shape(const fsdp_options& options, int world_size, int ranks_per_node) {
  if (options.device_mesh && options.strategy != sharding_strategy::hybrid_shard) {
    throw configuration_error("fsdp: device_mesh applies to HYBRID_SHARD only; sharding_strategy is " +
                              std::string(to_string(options.strategy)));
  }
  switch (options.strategy) {
    case sharding_strategy::full_shard:
    case sharding_strategy::shard_grad_op: return {1, world_size};
    case sharding_strategy::no_shard: return {world_size, 1};
    case sharding_strategy::hybrid_shard: break;
  }
  int replicate = 0;
  int shard = 0;
  if (options.device_mesh) {
    replicate = options.device_mesh->first;
    shard = options.device_mesh->second;
  } else {
    shard = std::max(1, ranks_per_node);
    replicate = world_size / shard;
  }
  if (replicate < 1 || shard < 1 || replicate * shard != world_size) {
    throw configuration_error("fsdp: HYBRID_SHARD's device_mesh (replicate=" + std::to_string(replicate) +
                              ", shard=" + std::to_string(shard) + ") must multiply to the world size " +
                              std::to_string(world_size) + " (Lightning's device_mesh=(replicate, shard))");
  }
  return {replicate, shard};
}

}  // namespace

fsdp_comm::fsdp_comm(comm::process_group& world, const fsdp_options& options, int ranks_per_node) {
  const auto [replicate, shard] = mesh_shape(options, world.size(), ranks_per_node);
  comm::device_mesh mesh(world, {replicate, shard}, {"replicate", "shard"});
  shard_size_ = shard;
  replicate_size_ = replicate;
  shard_rank_ = mesh.coordinate("shard");
  shard_group_ = mesh.group("shard");
  replicate_group_ = mesh.group("replicate");
}

void fsdp_comm::set_offload(bool offload, c10::Device compute_device) noexcept {
  offload_ = offload;
  compute_device_ = compute_device;
}

void fsdp_comm::shard_in(sharded_unit& unit) {
  if (store_ == nullptr || unit.params.empty() || unit.shard.storage().nbytes() == bytes_of(unit.shard)) return;
  allocate_storage(unit.shard, bytes_of(unit.shard));
  store_->load_shard(static_cast<std::size_t>(unit.partition), unit.shard);
}

void fsdp_comm::shard_out(sharded_unit& unit) {
  if (store_ == nullptr || pinned_ > 0) return;
  free_storage(unit.shard);
}

at::Tensor fsdp_comm::to_compute_device(const at::Tensor& host) {
  ++counters_.offload_to_device;
  return host.to(compute_device_);
}

void fsdp_comm::issue_gather(sharded_unit& unit, bool prefetch) {
  move_sharded(unit, sharded_state::sharded, sharded_state::gathering);
  allocate_storage(unit.full, bytes_of(unit.full));
  shard_in(unit);
  unit.gather = shard_group_.all_gather_into(unit.full, offload_ ? to_compute_device(unit.shard) : unit.shard);
  ++counters_.all_gathers;
  if (prefetch) ++counters_.prefetches;
}

void fsdp_comm::wait_gather(sharded_unit& unit) {
  move_sharded(unit, sharded_state::gathering, sharded_state::gathered);
  unit.gather.wait();
  shard_out(unit);
}

void fsdp_comm::issue_reduction(sharded_unit& unit, const at::Tensor& out) {
  const bool low = reduce_dtype_ && *reduce_dtype_ != unit.grad_shard.scalar_type();
  if (sharded()) {
    if (low) {
      unit.low_in = unit.full_grad.to(*reduce_dtype_);
      unit.low_out = at::empty({unit.shard_numel}, unit.low_in.options());
      unit.reduction = shard_group_.reduce_scatter_into(unit.low_out, unit.low_in, reduce_op::mean);
    } else {
      unit.reduction = shard_group_.reduce_scatter_into(out, unit.full_grad, reduce_op::mean);
    }
    ++counters_.reduce_scatters;
  } else {
    if (low) {
      unit.low_out = out.to(*reduce_dtype_);
      unit.reduction = replicate_group_.all_reduce_async(unit.low_out, reduce_op::mean);
    } else {
      unit.reduction = replicate_group_.all_reduce_async(out, reduce_op::mean);
    }
    ++counters_.all_reduces;
  }
  unit.reduction_pending = true;
}

void fsdp_comm::finish_reduction(sharded_unit& unit, const at::Tensor& out) {
  unit.reduction.wait();
  unit.reduction_pending = false;
  if (unit.low_out.defined()) {
    // Reduced in reduce_dtype: back into the gradients' dtype.
    at::Tensor target = out;
    target.copy_(unit.low_out);
    unit.low_in = at::Tensor();
    unit.low_out = at::Tensor();
  }
  if (sharded() && replicate_group_.valid()) {
    at::Tensor across = out;
    replicate_group_.all_reduce(across, reduce_op::mean);
    ++counters_.all_reduces;
  }
}

void fsdp_comm::release_buffers() {
  shard_group_.release_buffers();
  replicate_group_.release_buffers();
}

}  // namespace loom::detail
