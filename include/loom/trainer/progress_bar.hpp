// The trainer's progress bar, on global rank zero: epoch, batch/total, a bar,
// it/s, ETA, loss and the latest metrics. On a terminal it redraws one line
// in place (at most every refresh_seconds); otherwise (a log file, CI) it
// prints plain lines, a few per epoch. No torch headers.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom {

struct progress_bar_options {
  bool enabled = true;
  std::FILE* stream = stderr;
  // Unset: whether stream is a terminal.
  std::optional<bool> terminal;
  double refresh_seconds = 0.1;    // terminal: the fastest redraw
  std::int64_t lines_per_epoch = 10;  // not a terminal: plain lines per epoch (and one at its end)
  int bar_width = 20;
};

// One reading of the bar, and the line it makes (kept apart for tests).
struct progress_snapshot {
  std::int64_t epoch = 0;                    // 0-based; shown 1-based
  std::optional<std::int64_t> max_epochs;
  std::int64_t done = 0;                     // batches of this epoch done
  std::optional<std::int64_t> total;         // batches of this epoch
  double seconds = 0;                        // since the epoch's first batch of this process
  std::int64_t done_at_start = 0;            // batches already done when timing began (resume)
  std::vector<std::pair<std::string, double>> values;  // loss first, then metrics
  int bar_width = 20;
};
std::string format_progress(const progress_snapshot& snapshot);
// 75 -> "1:15", 3700 -> "1:01:40".
std::string format_duration(double seconds);

class progress_bar {
 public:
  progress_bar(progress_bar_options options, bool active);

  void start_epoch(std::int64_t epoch, std::optional<std::int64_t> max_epochs, std::optional<std::int64_t> total,
                   std::int64_t done);
  // Whether update() would draw now: the caller reads loss values (a device
  // sync) only then.
  bool due(std::int64_t done) const;
  void update(std::int64_t done, std::vector<std::pair<std::string, double>> values);
  // The epoch's final line, at `done` batches (a newline on a terminal).
  void end_epoch(std::int64_t done, std::vector<std::pair<std::string, double>> values);
  // A line of its own (validation results), not mixed into the bar.
  void message(const std::string& line);
  bool terminal() const noexcept { return terminal_; }
  bool active() const noexcept { return active_; }

 private:
  void draw(bool final);
  double elapsed() const;
  // Not a terminal: batches between plain lines.
  std::int64_t line_interval() const;

  progress_bar_options options_;
  bool active_;
  bool terminal_ = false;
  bool open_line_ = false;  // a terminal bar is drawn without its newline
  progress_snapshot snapshot_;
  std::chrono::steady_clock::time_point started_;
  std::chrono::steady_clock::time_point last_draw_;
  std::int64_t next_line_at_ = 0;
};

}  // namespace loom
