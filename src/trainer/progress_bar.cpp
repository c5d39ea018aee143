#include <loom/trainer/progress_bar.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace loom {

std::string format_duration(double seconds) {
  const auto total = static_cast<std::int64_t>(std::llround(std::max(0.0, seconds)));
  const std::int64_t hours = total / 3600;
  const std::int64_t minutes = (total % 3600) / 60;
  const std::int64_t secs = total % 60;
  char buffer[48];
  if (hours > 0) {
    std::snprintf(buffer, sizeof(buffer), "%lld:%02lld:%02lld", static_cast<long long>(hours),
                  static_cast<long long>(minutes), static_cast<long long>(secs));
  } else {
    std::snprintf(buffer, sizeof(buffer), "%lld:%02lld", static_cast<long long>(minutes), static_cast<long long>(secs));
  }
  return buffer;
}

namespace {
std::string format_value(double value) {
  char buffer[32];
  const double magnitude = std::fabs(value);
  if (value != 0 && (magnitude < 1e-3 || magnitude >= 1e5)) std::snprintf(buffer, sizeof(buffer), "%.3e", value);
  else std::snprintf(buffer, sizeof(buffer), "%.4f", value);
  return buffer;
}
}  // namespace

std::string format_progress(const progress_snapshot& s) {
  std::ostringstream line;
  line << "Epoch " << s.epoch + 1;
  if (s.max_epochs) line << "/" << *s.max_epochs;
  if (s.total && *s.total > 0) {
    const double fraction = std::clamp(static_cast<double>(s.done) / static_cast<double>(*s.total), 0.0, 1.0);
    const int filled = static_cast<int>(fraction * s.bar_width);
    line << " [" << std::string(static_cast<std::size_t>(filled), '#')
         << std::string(static_cast<std::size_t>(s.bar_width - filled), '.') << "] " << s.done << "/" << *s.total
         << " " << static_cast<int>(fraction * 100) << "%";
  } else {
    line << " " << s.done;
  }
  const std::int64_t timed = s.done - s.done_at_start;
  if (timed > 0 && s.seconds > 0) {
    const double rate = static_cast<double>(timed) / s.seconds;
    char buffer[32];
    std::snprintf(buffer, sizeof(buffer), " %.1f it/s", rate);
    line << buffer;
    if (s.total) line << " ETA " << format_duration(static_cast<double>(*s.total - s.done) / rate);
  }
  for (const auto& [name, value] : s.values) line << " " << name << "=" << format_value(value);
  return line.str();
}

progress_bar::progress_bar(progress_bar_options options, bool active)
    : options_(options), active_(active && options.enabled && options.stream != nullptr) {
  terminal_ = options_.terminal.value_or(active_ && ::isatty(::fileno(options_.stream)) != 0);
  snapshot_.bar_width = options_.bar_width;
}

double progress_bar::elapsed() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
}

void progress_bar::start_epoch(std::int64_t epoch, std::optional<std::int64_t> max_epochs,
                               std::optional<std::int64_t> total, std::int64_t done) {
  snapshot_.epoch = epoch;
  snapshot_.max_epochs = max_epochs;
  snapshot_.total = total;
  snapshot_.done = done;
  snapshot_.done_at_start = done;
  snapshot_.values.clear();
  started_ = std::chrono::steady_clock::now();
  last_draw_ = started_;
  next_line_at_ = (done / line_interval() + 1) * line_interval();
}

std::int64_t progress_bar::line_interval() const {
  if (!snapshot_.total) return 100;
  const std::int64_t lines = std::max<std::int64_t>(1, options_.lines_per_epoch);
  return std::max<std::int64_t>(1, (*snapshot_.total + lines - 1) / lines);
}

bool progress_bar::due(std::int64_t done) const {
  if (!active_) return false;
  if (terminal_) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - last_draw_).count() >=
               options_.refresh_seconds ||
           done == snapshot_.done_at_start + 1;
  }
  return done >= next_line_at_ && (!snapshot_.total || done < *snapshot_.total);
}

void progress_bar::update(std::int64_t done, std::vector<std::pair<std::string, double>> values) {
  snapshot_.done = done;
  if (!values.empty()) snapshot_.values = std::move(values);
  if (!due(done)) return;
  if (!terminal_) next_line_at_ = (done / line_interval() + 1) * line_interval();
  draw(false);
}

void progress_bar::end_epoch(std::int64_t done, std::vector<std::pair<std::string, double>> values) {
  snapshot_.done = done;
  if (!values.empty()) snapshot_.values = std::move(values);
  if (active_) draw(true);
}

void progress_bar::message(const std::string& line) {
  if (!active_) return;
  if (open_line_) {
    std::fputc('\n', options_.stream);
    open_line_ = false;
  }
  std::fprintf(options_.stream, "%s\n", line.c_str());
  std::fflush(options_.stream);
}

void progress_bar::draw(bool final) {
  snapshot_.seconds = elapsed();
  last_draw_ = std::chrono::steady_clock::now();
  const std::string line = format_progress(snapshot_);
  if (terminal_) {
    // \r and clear to the end of the line: the bar redraws in place.
    std::fprintf(options_.stream, "\r%s\033[K", line.c_str());
    open_line_ = !final;
    if (final) std::fputc('\n', options_.stream);
  } else {
    std::fprintf(options_.stream, "%s\n", line.c_str());
  }
  std::fflush(options_.stream);
}

}  // namespace loom
