// The options of loom::trainer (Lightning's "build your own trainer" example,
// with its names and defaults) and of one fit call.
#pragma once

#include <loom/trainer/progress_bar.hpp>
#include <loom/wrap/dataloader.hpp>

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

enum class clip_algorithm { norm, value };

struct trainer_options {
  // Stop after this many epochs (unset: no limit; then max_steps must be set).
  std::optional<std::int64_t> max_epochs = 1000;
  // Stop after this many optimizer steps (unset: no limit).
  std::optional<std::int64_t> max_steps;
  // Batches per optimizer step. All but the last batch of a window run under
  // no_backward_sync; each loss is divided by grad_accum_steps (Lightning's
  // Trainer); an epoch that ends inside a window steps on what it has.
  std::int64_t grad_accum_steps = 1;
  // Batches per epoch / per validation (unset: all).
  std::optional<std::int64_t> limit_train_batches;
  std::optional<std::int64_t> limit_val_batches;
  // Validate after every n-th epoch (Lightning Trainer's check_val_every_n_epoch).
  std::int64_t validation_frequency = 1;
  // Shard the data over ranks (loom's DistributedSampler); false: every rank
  // sees the whole dataset.
  bool use_distributed_sampler = true;
  // Checkpoints: <checkpoint_dir>/epoch=E-step=S.ckpt every
  // checkpoint_frequency epochs (0: never) and when fit stops.
  std::string checkpoint_dir = "./checkpoints";
  std::int64_t checkpoint_frequency = 1;
  // Clip gradients before each optimizer step (after unscaling, under 16-mixed).
  std::optional<double> gradient_clip_val;
  clip_algorithm gradient_clip_algorithm = clip_algorithm::norm;
  // Log the training step's loss and metrics every n optimizer steps.
  std::int64_t log_every_n_steps = 50;
  progress_bar_options progress_bar;
  // Throughput (Lightning's ThroughputMonitor) logged with the training
  // metrics: batches/s, samples/s, and with flops_per_batch (per device,
  // e.g. from loom::measure_flops) flops/s; with available_flops (one
  // device's peak) MFU. Rolling over window_size optimizer steps.
  bool log_throughput = true;
  std::optional<double> flops_per_batch;
  std::optional<double> available_flops;
  std::int64_t throughput_window = 100;
};

struct fit_options {
  loader_options train_loader{.batch_size = 1, .shuffle = true};
  loader_options val_loader{.batch_size = 1};
  // "" (start afresh), "last" (the newest checkpoint in checkpoint_dir, or
  // afresh when there is none) or a checkpoint's path.
  std::string resume;
};

}  // namespace loom
