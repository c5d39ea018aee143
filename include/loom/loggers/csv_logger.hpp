// Lightning's CSVLogger: <root_dir>/<name>/version_<n>/metrics.csv, one row per
// log_metrics call with a "step" column, columns in order of first appearance.
#pragma once

#include <loom/loggers/logger.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace loom {

struct csv_logger_options {
  std::string name = "lightning_logs";
  // Unset: the next free version_<n> under root_dir/name. A string is used as
  // the directory name as it is.
  std::optional<std::variant<std::int64_t, std::string>> version;
  std::string prefix;  // joined to metric names with '-'
  std::int64_t flush_logs_every_n_steps = 100;
};

class csv_logger {
 public:
  explicit csv_logger(std::string root_dir, csv_logger_options options = {});

  void log_metrics(const metrics& values, std::optional<std::int64_t> step = std::nullopt);
  // Written to hparams.yaml next to metrics.csv (as Lightning's Trainer CSVLogger does).
  void log_hyperparams(const hyperparameters& values);
  // Writes what is logged so far; rewrites the file only when columns were added.
  void save();
  void finalize(std::string_view status);
  // Continues the run in log_dir (the directory a checkpoint recorded): reads
  // its metrics.csv, drops the rows logged after `step`, rewrites the file and
  // appends from there (what a resumed fit needs so no step appears twice).
  void resume(const std::string& log_dir, std::int64_t step);

  const std::string& root_dir() const noexcept { return root_dir_; }
  const std::string& name() const noexcept { return options_.name; }
  std::string version() const;
  std::string log_dir() const;
  std::string metrics_file() const { return log_dir() + "/metrics.csv"; }

 private:
  struct row {
    std::vector<std::pair<std::size_t, metric_value>> cells;  // column index -> value
  };
  void resolve_version() const;

  std::string root_dir_;
  csv_logger_options options_;
  mutable std::optional<std::variant<std::int64_t, std::string>> version_;
  std::optional<std::string> resumed_dir_;  // set by resume(): the directory written to
  std::vector<std::string> columns_;
  std::vector<row> rows_;
  std::size_t rows_written_ = 0;
  std::size_t columns_written_ = 0;
};

// Python's repr of a float (shortest round trip, "1.0" rather than "1").
std::string format_metric(const metric_value& value);

}  // namespace loom
