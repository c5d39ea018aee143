// Lightning's TensorBoardLogger: one TensorBoard event file per run directory
// (<root_dir>/<name>/version_<n>/events.out.tfevents.<time>.<host>.<pid>.<n>),
// scalars as Summary values and hyperparameters through the hparams plugin,
// written by global rank zero (Fabric only calls loggers there). The file is
// TFRecord-framed (length, masked CRC32C of it, data, masked CRC32C of it);
// the messages are TensorBoard's, generated at build time from
// src/loggers/proto/loom_tensorboard.proto. No protobuf or torch headers here.
#pragma once

#include <loom/loggers/log_version.hpp>
#include <loom/loggers/logger.hpp>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

namespace loom {

struct tensorboard_logger_options {
  std::string name = "lightning_logs";
  std::optional<log_version> version;  // unset: the next free version_<n>
  std::string prefix;                  // joined to tags with '-'
  std::string sub_dir;                 // an extra directory under the version's
  // As Lightning: log_hyperparams also logs hp_metric = -1, so the hparams
  // tab has a metric to show.
  bool default_hp_metric = true;
  // Events buffered before a write to the file (save() and finalize() write too).
  std::int64_t flush_every = 50;
};

class tensorboard_logger {
 public:
  explicit tensorboard_logger(std::string root_dir, tensorboard_logger_options options = {});
  tensorboard_logger(tensorboard_logger&&) noexcept;
  tensorboard_logger& operator=(tensorboard_logger&&) noexcept;
  ~tensorboard_logger();

  // One scalar event per value (SummaryWriter.add_scalar), at step (unset:
  // the number of earlier log_metrics calls).
  void log_metrics(const metrics& values, std::optional<std::int64_t> step = std::nullopt);
  // The hparams plugin's experiment, session start and session end
  // summaries; strings, booleans and numbers.
  void log_hyperparams(const hyperparameters& values);
  void save();
  void finalize(std::string_view status);
  // A resumed run: a SessionLog START at step + 1, which tells TensorBoard to
  // drop the events this directory holds past the checkpoint's step (what
  // SummaryWriter(purge_step=...) writes). Later events go to a new file in
  // log_dir.
  void resume(const std::string& log_dir, std::int64_t step);

  std::string log_dir() const;
  // The event file (created at the first event; "" before).
  std::string event_file() const;

 private:
  struct writer;
  std::string root_dir_;
  tensorboard_logger_options options_;
  mutable std::optional<log_version> version_;
  std::optional<std::string> resumed_dir_;
  std::int64_t calls_ = 0;
  std::unique_ptr<writer> writer_;
  writer& open();
};

// CRC-32C (Castagnoli) and TFRecord's masked form, for readers and tests.
std::uint32_t crc32c(const void* data, std::size_t size);
std::uint32_t masked_crc32c(const void* data, std::size_t size);

}  // namespace loom
