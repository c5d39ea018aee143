// The sharding engine's communication context: its mesh (replicate x shard,
// cut from the world as every mesh is, so its traffic never interleaves with
// the user's collectives) and the collectives a unit's step issues over it:
// the parameter all-gather, the gradient reduce-scatter (over one shard, the
// all-reduce across replicas), HYBRID_SHARD's all-reduce across replicas
// after the reduce-scatter, each in reduce_dtype where asked; cpu_offload's
// moves; the shard store's reads; the counters tests read. What knows about
// devices and overlap lives here (the place CUDA streams belong); what a
// reduced gradient means to the parameters is the engine's (fsdp_engine.cpp).
#pragma once

#include "fsdp_unit.hpp"

#include <loom/comm/process_group.hpp>
#include <loom/strategy/fsdp_engine.hpp>
#include <loom/strategy/fsdp_options.hpp>

#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <optional>

namespace loom::detail {

class fsdp_comm {
 public:
  // Collective over world (it forms the groups). Throws configuration_error
  // for a device_mesh that does not fit the world or the sharding strategy.
  fsdp_comm(comm::process_group& world, const fsdp_options& options, int ranks_per_node);

  bool sharded() const noexcept { return shard_size_ > 1; }
  int shard_size() const noexcept { return shard_size_; }
  int shard_rank() const noexcept { return shard_rank_; }
  int replicate_size() const noexcept { return replicate_size_; }
  comm::process_group& shard_group() noexcept { return shard_group_; }
  const comm::process_group& shard_group() const noexcept { return shard_group_; }
  const comm::process_group& replicate_group() const noexcept { return replicate_group_; }
  fsdp_counters& counters() noexcept { return counters_; }
  const fsdp_counters& counters() const noexcept { return counters_; }

  // cpu_offload: shards (parameters, gradients, so the optimizer's state)
  // live on the host; each gather moves the parameter shard to the compute
  // device and each reduction moves the gradient shard back. On cpu both
  // moves are the identity (Tensor::to and a copy onto itself are no-ops):
  // the schedule runs and is counted, and nothing is copied.
  void set_offload(bool offload, c10::Device compute_device) noexcept;
  bool offload() const noexcept { return offload_; }
  // The dtype gradients are reduced in (nullopt: the parameters').
  void set_reduce_dtype(std::optional<c10::ScalarType> dtype) noexcept { reduce_dtype_ = dtype; }

  // offload_param to NVMe: shards are read from the store for each gather
  // and freed when it completes, unless pinned (a checkpoint holds them).
  shard_store* store() const noexcept { return store_; }
  void set_store(shard_store* store) noexcept { store_ = store; }
  void pin() noexcept { ++pinned_; }
  void unpin() noexcept { --pinned_; }
  void shard_in(sharded_unit& unit);
  void shard_out(sharded_unit& unit);

  // sharded -> gathering: the full buffer allocated, the all-gather issued.
  void issue_gather(sharded_unit& unit, bool prefetch);
  // gathering -> gathered.
  void wait_gather(sharded_unit& unit);
  // The unit's gradients reduced, averaged: its full gradient buffer
  // reduce-scattered into `out` (sharded), or its gradient shard all-reduced
  // across replicas in place (one shard). Issued, not waited for.
  void issue_reduction(sharded_unit& unit, const at::Tensor& out);
  // Waits for it; back from reduce_dtype into `out`; across replicas
  // (HYBRID_SHARD) after a reduce-scatter; to the host under cpu_offload.
  void finish_reduction(sharded_unit& unit, const at::Tensor& out);
  // cpu_offload: the reduced gradient shard back on the host. On cpu it is
  // there already (counted, not copied); offload is refused on other devices.
  void gradient_to_host() noexcept {
    if (offload_) ++counters_.offload_to_host;
  }
  // The groups' staging buffers go back between steps.
  void release_buffers();

 private:
  at::Tensor to_compute_device(const at::Tensor& host);

  comm::process_group shard_group_;      // invalid when the shard group is one rank
  comm::process_group replicate_group_;  // invalid when the replicate group is one rank
  int shard_size_ = 1;
  int shard_rank_ = 0;
  int replicate_size_ = 1;
  bool offload_ = false;
  c10::Device compute_device_{c10::DeviceType::CPU};
  std::optional<c10::ScalarType> reduce_dtype_;
  fsdp_counters counters_;
  shard_store* store_ = nullptr;
  int pinned_ = 0;
};

}  // namespace loom::detail
