#include "builtin_combinations.hpp"

#include <loom/strategy/deepspeed.hpp>

#include <limits>

namespace loom::runtime::builtin {

namespace {
// deepspeed_options under Lightning's DeepSpeedStrategy argument names, over
// a preset's defaults; "config" takes a JSON object or a file's path.
deepspeed_options read_deepspeed(option_reader& reader) {
  deepspeed_options o;
  constexpr std::int64_t big = std::numeric_limits<std::int64_t>::max();
  read_process_options(reader, o.process);
  reader.read("zero_optimization", o.zero_optimization);
  std::int64_t stage = o.stage;
  reader.read("stage", stage, 0, 3);
  o.stage = static_cast<int>(stage);
  std::string remote;
  reader.read("remote_device", remote, {"cpu", "nvme"});
  if (!remote.empty()) o.remote_device = remote;
  reader.read("offload_optimizer", o.offload_optimizer);
  reader.read("offload_parameters", o.offload_parameters);
  reader.read("offload_params_device", o.offload_params_device, {"cpu", "nvme"});
  reader.read("offload_optimizer_device", o.offload_optimizer_device, {"cpu", "nvme"});
  reader.read("nvme_path", o.nvme_path);
  reader.read("params_buffer_count", o.params_buffer_count, 1, 1 << 16);
  reader.read("params_buffer_size", o.params_buffer_size, 1, big);
  reader.read("max_in_cpu", o.max_in_cpu, 0, big);
  reader.read("optimizer_buffer_count", o.optimizer_buffer_count, 1, 1 << 16);
  reader.read("block_size", o.block_size, 512, big);
  reader.read("queue_depth", o.queue_depth, 1, 1 << 16);
  reader.read("single_submit", o.single_submit);
  reader.read("overlap_events", o.overlap_events);
  reader.read("thread_count", o.thread_count, 1, 1024);
  reader.read("pin_memory", o.pin_memory);
  reader.read("sub_group_size", o.sub_group_size, 1, big);
  reader.read("contiguous_gradients", o.contiguous_gradients);
  reader.read("overlap_comm", o.overlap_comm);
  reader.read("allgather_partitions", o.allgather_partitions);
  reader.read("reduce_scatter", o.reduce_scatter);
  reader.read("allgather_bucket_size", o.allgather_bucket_size, 1, big);
  reader.read("reduce_bucket_size", o.reduce_bucket_size, 1, big);
  reader.read("zero_allow_untested_optimizer", o.zero_allow_untested_optimizer);
  std::int64_t logging_batch = 0;
  reader.read("logging_batch_size_per_gpu", logging_batch, 0, big);
  if (logging_batch > 0) o.logging_batch_size_per_gpu = logging_batch;
  reader.read_object_or_path("config", o.config);
  reader.read("logging_level", o.logging_level, {"DEBUG", "INFO", "WARN", "WARNING", "ERROR", "CRITICAL"});
  reader.read("loss_scale", o.loss_scale, -1e-300, 1e300);
  reader.read("initial_scale_power", o.initial_scale_power, 0, 64);
  reader.read("loss_scale_window", o.loss_scale_window, 1, big);
  reader.read("hysteresis", o.hysteresis, 1, big);
  reader.read("min_loss_scale", o.min_loss_scale, -1e-300, 1e300);
  reader.read("partition_activations", o.partition_activations);
  reader.read("cpu_checkpointing", o.cpu_checkpointing);
  reader.read("contiguous_memory_optimization", o.contiguous_memory_optimization);
  reader.read("synchronize_checkpoint_boundary", o.synchronize_checkpoint_boundary);
  reader.read("load_full_weights", o.load_full_weights);
  reader.read("exclude_frozen_parameters", o.exclude_frozen_parameters);
  return o;
}

template <class S>
preset<S> deepspeed_preset(const char* name, const char* type) {
  return preset<S>{name, type, [](option_reader& reader) { return S(read_deepspeed(reader)); }};
}
}  // namespace

std::vector<std::vector<registry_entry>> deepspeed_entries() {
  return entries(deepspeed_preset<deepspeed>("deepspeed", "loom::deepspeed"),
                 deepspeed_preset<deepspeed_stage_1>("deepspeed_stage_1", "loom::deepspeed_stage_1"),
                 deepspeed_preset<deepspeed_stage_1_offload>("deepspeed_stage_1_offload",
                                                             "loom::deepspeed_stage_1_offload"),
                 deepspeed_preset<deepspeed_stage_2>("deepspeed_stage_2", "loom::deepspeed_stage_2"),
                 deepspeed_preset<deepspeed_stage_2_offload>("deepspeed_stage_2_offload",
                                                             "loom::deepspeed_stage_2_offload"),
                 deepspeed_preset<deepspeed_stage_3>("deepspeed_stage_3", "loom::deepspeed_stage_3"),
                 deepspeed_preset<deepspeed_stage_3_offload>("deepspeed_stage_3_offload",
                                                             "loom::deepspeed_stage_3_offload"),
                 deepspeed_preset<deepspeed_stage_3_offload_nvme>("deepspeed_stage_3_offload_nvme",
                                                                  "loom::deepspeed_stage_3_offload_nvme"));
}

}  // namespace loom::runtime::builtin
