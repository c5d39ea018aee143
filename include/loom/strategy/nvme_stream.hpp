// ZeRO-Infinity's optimizer offload to NVMe (DeepSpeed offload_optimizer
// device "nvme"), for loom::deepspeed: the Adam state of this rank's
// partition lives in one file under nvme_path, opened with O_DIRECT, and is
// streamed through buffer_count aligned host buffers, one sub-group
// (sub_group_size elements) at a time, with io_uring: while the step of
// sub-group g runs, the reads of the next sub-groups and the write of the
// previous one are in flight. Host memory holds only the buffers. The file
// is removed when the stream goes. Compiled in src/ (liburing stays there).
#pragma once

#include <loom/strategy/fsdp_engine.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace loom::detail {

// Adam's (and AdamW's) hyperparameters, as LibTorch's optimizers hold them.
struct adam_hyper {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0;
  bool decoupled = false;  // AdamW
};

// Adam's state of this rank's partitions, whole (for checkpoints): per
// segment (as given to the stream) exp_avg and exp_avg_sq, and the step
// count (0: no step yet, the tensors are empty).
struct adam_partition_state {
  std::vector<at::Tensor> exp_avg, exp_avg_sq;
  std::int64_t step = 0;
};

struct nvme_stream_options {
  std::string directory;          // nvme_path
  int rank = 0;
  std::int64_t sub_group_size = 1'000'000'000'000;  // elements per sub-group
  int buffer_count = 4;           // offload_optimizer.buffer_count
  int queue_depth = 8;            // aio.queue_depth
  std::int64_t block_size = 1'048'576;  // aio.block_size: bytes per request
  // offload_param to NVMe too: the parameter partitions live in the file
  // beside their state (the stream is then the engine's shard_store), read
  // for each gather and by the step, which updates them there.
  bool parameters = false;
  // DeepSpeed's bf16 mode: the partitions are 16-bit and the file holds
  // their fp32 masters (in the parameters' place of each region), which the
  // step updates and casts back into the partition (or, with parameters,
  // which each read for a gather casts).
  bool masters = false;
};

// What the stream did, for tests (loom-bench reads loom/util/offload_io.hpp).
struct nvme_counters {
  std::uint64_t steps = 0;
  std::uint64_t sub_groups = 0;       // per step
  std::uint64_t bytes_read = 0, bytes_written = 0;
  double read_busy_seconds = 0;       // time with at least one read in flight
  double write_busy_seconds = 0;      // time with at least one write in flight
  std::int64_t buffer_bytes = 0;      // every buffer, as allocated
  std::int64_t state_bytes_per_sub_group = 0;  // a buffer: one sub-group's region
  std::uint64_t shard_loads = 0, shard_stores = 0;  // offload_param: partitions read for gathers, written
};

class nvme_stream final : public shard_store {
 public:
  // segments: this rank's flat parameter partitions (1-D, fp32) and their
  // gradients, in order; they are cut into sub-groups. Checks the directory
  // (exists, writable, O_DIRECT) and creates the state file.
  nvme_stream(const nvme_stream_options& options, std::vector<at::Tensor> parameters, std::vector<at::Tensor> gradients);
  nvme_stream(const nvme_stream&) = delete;
  nvme_stream& operator=(const nvme_stream&) = delete;
  ~nvme_stream() override;

  // One Adam step over every sub-group: the state read, updated as
  // torch::optim::Adam/AdamW update it, and written back. grad_scale (a
  // clipping coefficient, applied to the fp32 gradient) when not 1.
  void step(const adam_hyper& hyper, double grad_scale = 1.0);

  // The state file read back whole, sub-group by sub-group through one
  // buffer (fabric.save), and written from such a state (fabric.load). The
  // checkpoint holds the whole partition in memory for the while, as any
  // save does.
  adam_partition_state read_state();
  void write_state(const adam_partition_state& state);

  // shard_store (options.parameters): a partition's parameters read from,
  // or written to, their regions of the file, through one buffer (cast to
  // and from the fp32 masters under options.masters; an fp32 tensor reads
  // or writes the masters themselves).
  void load_shard(std::size_t partition, const at::Tensor& shard) override;
  void store_shard(std::size_t partition, const at::Tensor& shard) override;

  const nvme_counters& counters() const noexcept;
  std::string file() const;
  // The buffers (for counting storages once).
  std::vector<at::Tensor> buffers() const;

  // Throws loom::configuration_error naming the path when it does not exist,
  // is not a writable directory, or its file system refuses O_DIRECT.
  static void check_directory(const std::string& directory);

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace loom::detail
