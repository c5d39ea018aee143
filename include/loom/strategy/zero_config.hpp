// What loom's ZeRO runs: a DeepSpeed configuration resolved and checked
// against loom's key table (src/strategy/zero_config.cpp). Every key of a
// ds_config.json is honoured, ignored with a notice, or refused with a
// sentence naming it; an unknown key, "auto", a wrong type or value, and the
// combinations DeepSpeed refuses are errors (loom::configuration_error).
#pragma once

#include <loom/concepts/precision_dtypes.hpp>
#include <loom/strategy/deepspeed_options.hpp>
#include <loom/strategy/zero_loss_scaling.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace loom {

enum class offload_device { none, cpu, nvme };

struct zero_offload {
  offload_device device = offload_device::none;
  std::string nvme_path;
  std::int64_t buffer_count = 4;
  std::int64_t buffer_size = 100'000'000;
  std::int64_t max_in_cpu = 1'000'000'000;
  bool pin_memory = false;
};

struct zero_aio {
  std::int64_t block_size = 1'048'576;
  std::int64_t queue_depth = 8;
  bool single_submit = false;
  bool overlap_events = true;
  std::int64_t thread_count = 1;
};

struct zero_config {
  int stage = 2;  // 0: no sharding (zero_optimization false or stage 0)
  zero_offload offload_optimizer;
  zero_offload offload_param;
  zero_aio aio;
  bool contiguous_gradients = true;
  bool overlap_comm = true;
  bool allgather_partitions = true;
  bool reduce_scatter = true;
  std::int64_t allgather_bucket_size = 200'000'000;
  std::int64_t reduce_bucket_size = 200'000'000;
  std::int64_t sub_group_size = 1'000'000'000'000;
  zero_loss_scaling fp16;
  bool bf16 = false;
  double gradient_clipping = 0;  // 0: off
  std::int64_t gradient_accumulation_steps = 1;
  std::int64_t train_micro_batch_size_per_gpu = 1;
  std::int64_t train_batch_size = 0;  // micro batch x accumulation x world size
  std::string communication_data_type;  // "": the gradients' dtype; "fp32", "fp16" or "bf16"
  bool zero_allow_untested_optimizer = true;
  bool load_full_weights = false;
  bool exclude_frozen_parameters = false;
  // Where it came from ("the strategy's arguments", "config file PATH",
  // "PL_DEEPSPEED_CONFIG_PATH=PATH", "a config object"), for messages.
  std::string source;
  // Keys and arguments accepted but without effect in loom, each a sentence
  // saying why (printed once by rank 0).
  std::vector<std::string> notices;
};

// Resolves options (their config, PL_DEEPSPEED_CONFIG_PATH, or the arguments
// as Lightning maps them) under the Fabric's precision and world size.
zero_config resolve_zero_config(const deepspeed_options& options, const precision_dtypes& precision, int world_size);

}  // namespace loom
