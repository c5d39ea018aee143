// DeepSpeedStrategy's constructor arguments under Lightning's names and with
// its defaults, for loom::deepspeed (ZeRO on loom's sharding engine). They
// become a DeepSpeed JSON config as Lightning's _create_default_config builds
// it, unless `config` (or PL_DEEPSPEED_CONFIG_PATH) gives one, which then
// replaces them all, as in Lightning. zero_config.hpp resolves either into
// what the engine runs; docs/deepspeed.md lists each argument and key.
#pragma once

#include <loom/strategy/process_options.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

struct deepspeed_options {
  bool zero_optimization = true;
  int stage = 2;
  std::optional<std::string> remote_device;  // "cpu" or "nvme": where zero.Init places parameters
  bool offload_optimizer = false;
  bool offload_parameters = false;
  std::string offload_params_device = "cpu";
  std::string offload_optimizer_device = "cpu";
  std::string nvme_path = "/local_nvme";
  std::int64_t params_buffer_count = 5;
  std::int64_t params_buffer_size = 100'000'000;
  std::int64_t max_in_cpu = 1'000'000'000;
  std::int64_t optimizer_buffer_count = 4;
  // Asynchronous I/O of NVMe offload (DeepSpeed's "aio" section).
  std::int64_t block_size = 1'048'576;
  std::int64_t queue_depth = 8;
  bool single_submit = false;
  bool overlap_events = true;
  std::int64_t thread_count = 1;
  bool pin_memory = false;
  std::int64_t sub_group_size = 1'000'000'000'000;
  bool contiguous_gradients = true;
  bool overlap_comm = true;
  bool allgather_partitions = true;
  bool reduce_scatter = true;
  std::int64_t allgather_bucket_size = 200'000'000;
  std::int64_t reduce_bucket_size = 200'000'000;
  bool zero_allow_untested_optimizer = true;
  std::optional<std::int64_t> logging_batch_size_per_gpu;
  // A DeepSpeed JSON config: a file's path, or the JSON text itself ("{...}";
  // deepspeed_json.hpp turns an nlohmann::json object into it). Empty: the
  // file PL_DEEPSPEED_CONFIG_PATH names, else the arguments above.
  std::string config;
  std::string logging_level = "WARN";
  // fp16 (16-mixed) dynamic loss scaling; loss_scale > 0 is a static scale.
  double loss_scale = 0;
  std::int64_t initial_scale_power = 16;
  std::int64_t loss_scale_window = 1000;
  std::int64_t hysteresis = 2;
  double min_loss_scale = 1;
  // DeepSpeed's activation checkpointing (deepspeed.checkpointing).
  bool partition_activations = false;
  bool cpu_checkpointing = false;
  bool contiguous_memory_optimization = false;
  bool synchronize_checkpoint_boundary = false;
  bool load_full_weights = false;
  bool exclude_frozen_parameters = false;
  // The processes it runs on (timeout, backend, launcher, MPI communicator,
  // watchdog), as every distributed strategy takes them.
  process_options process;
};

}  // namespace loom
