#include <loom/loggers/csv_format.hpp>
#include <loom/loggers/csv_logger.hpp>
#include <loom/loggers/log_version.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <system_error>

namespace loom {

namespace fs = std::filesystem;

std::string format_metric(const metric_value& value) {
  if (const auto* integer = std::get_if<std::int64_t>(&value)) return std::to_string(*integer);
  const double number = std::get<double>(value);
  if (std::isnan(number)) return "nan";
  if (std::isinf(number)) return number > 0 ? "inf" : "-inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), number);
  std::string text(buffer, end);
  // Python writes 1.0 and 1e+16; to_chars writes 1 and 1e+16.
  if (text.find_first_of(".e") == std::string::npos) text += ".0";
  return text;
}

csv_logger::csv_logger(std::string root_dir, csv_logger_options options)
    : root_dir_(std::move(root_dir)), options_(std::move(options)), version_(options_.version) {
  if (options_.flush_logs_every_n_steps <= 0) {
    throw std::invalid_argument("csv_logger: flush_logs_every_n_steps must be positive");
  }
}

void csv_logger::resolve_version() const {
  if (!version_) version_ = next_log_version((fs::path(root_dir_) / options_.name).string());
}

std::string csv_logger::version() const {
  resolve_version();
  if (const auto* number = std::get_if<std::int64_t>(&*version_)) return std::to_string(*number);
  return std::get<std::string>(*version_);
}

std::string csv_logger::log_dir() const {
  if (resumed_dir_) return *resumed_dir_;
  resolve_version();
  return versioned_log_dir(root_dir_, options_.name, *version_);
}

void csv_logger::log_metrics(const metrics& values, std::optional<std::int64_t> step) {
  const std::int64_t row_step = step.value_or(static_cast<std::int64_t>(rows_.size()));
  row entry;
  auto column_of = [this](const std::string& name) {
    auto it = std::find(columns_.begin(), columns_.end(), name);
    if (it != columns_.end()) return static_cast<std::size_t>(it - columns_.begin());
    columns_.push_back(name);
    return columns_.size() - 1;
  };
  for (const auto& [name, value] : values) {
    entry.cells.emplace_back(column_of(options_.prefix.empty() ? name : options_.prefix + "-" + name), value);
  }
  entry.cells.emplace_back(column_of("step"), metric_value{row_step});
  rows_.push_back(std::move(entry));
  if ((row_step + 1) % options_.flush_logs_every_n_steps == 0) save();
}


void csv_logger::save() {
  if (rows_.empty()) return;
  const fs::path dir = log_dir();
  fs::create_directories(dir);
  const fs::path file = dir / "metrics.csv";
  auto write_rows = [this](std::ofstream& out, std::size_t from) {
    for (std::size_t r = from; r < rows_.size(); ++r) {
      std::vector<std::string> fields(columns_.size());
      for (const auto& [column, value] : rows_[r].cells) fields[column] = format_metric(value);
      for (std::size_t c = 0; c < fields.size(); ++c) out << (c ? "," : "") << fields[c];
      out << "\r\n";  // Python's csv module ends rows with \r\n
    }
  };
  if (columns_.size() == columns_written_ && rows_written_ > 0) {
    std::ofstream out(file, std::ios::app | std::ios::binary);
    write_rows(out, rows_written_);
    if (!out) throw std::runtime_error("csv_logger: cannot write " + file.string());
  } else {
    // New columns: the header changes, so the whole file is written again,
    // to a temporary name first so a crash leaves the old file whole.
    const fs::path temporary = dir / "metrics.csv.tmp";
    {
      std::ofstream out(temporary, std::ios::trunc | std::ios::binary);
      for (std::size_t c = 0; c < columns_.size(); ++c) out << (c ? "," : "") << csv_field(columns_[c]);
      out << "\r\n";
      write_rows(out, 0);
      if (!out) throw std::runtime_error("csv_logger: cannot write " + temporary.string());
    }
    fs::rename(temporary, file);
  }
  rows_written_ = rows_.size();
  columns_written_ = columns_.size();
}

void csv_logger::log_hyperparams(const hyperparameters& values) {
  const fs::path dir = log_dir();
  fs::create_directories(dir);
  std::ofstream out(dir / "hparams.yaml", std::ios::trunc);
  for (const auto& [name, value] : values) {
    out << name << ": ";
    std::visit(
        [&out](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, bool>) out << (v ? "true" : "false");
          else if constexpr (std::is_same_v<T, std::string>) out << '\'' << v << '\'';
          else if constexpr (std::is_same_v<T, double>) out << format_metric(metric_value{v});
          else out << v;
        },
        value);
    out << '\n';
  }
}

void csv_logger::finalize(std::string_view /*status*/) { save(); }

namespace {
metric_value parse_metric(const std::string& text, const std::string& file) {
  std::int64_t integer = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), integer);
  if (ec == std::errc{} && end == text.data() + text.size()) return integer;
  if (text == "nan") return std::numeric_limits<double>::quiet_NaN();
  if (text == "inf") return std::numeric_limits<double>::infinity();
  if (text == "-inf") return -std::numeric_limits<double>::infinity();
  double number = 0;
  auto [dend, dec] = std::from_chars(text.data(), text.data() + text.size(), number);
  if (dec != std::errc{} || dend != text.data() + text.size()) {
    throw std::runtime_error("csv_logger: cannot resume from " + file + ": '" + text + "' is not a number");
  }
  return number;
}
}  // namespace

void csv_logger::resume(const std::string& log_dir, std::int64_t step) {
  resumed_dir_ = log_dir;
  columns_.clear();
  rows_.clear();
  const fs::path file = fs::path(log_dir) / "metrics.csv";
  std::ifstream in(file, std::ios::binary);
  std::string line;
  if (in && std::getline(in, line)) {
    columns_ = split_csv_line(line);
    const auto step_column = std::find(columns_.begin(), columns_.end(), "step");
    if (step_column == columns_.end()) {
      throw std::runtime_error("csv_logger: cannot resume from " + file.string() + ": it has no 'step' column");
    }
    const auto step_index = static_cast<std::size_t>(step_column - columns_.begin());
    while (std::getline(in, line)) {
      if (line.empty() || line == "\r") continue;
      const auto fields = split_csv_line(line);
      row entry;
      bool keep = true;
      for (std::size_t c = 0; c < fields.size() && c < columns_.size(); ++c) {
        if (fields[c].empty()) continue;
        const metric_value value = parse_metric(fields[c], file.string());
        if (c == step_index) {
          const auto* logged = std::get_if<std::int64_t>(&value);
          keep = logged != nullptr && *logged <= step;
        }
        entry.cells.emplace_back(c, value);
      }
      if (keep) rows_.push_back(std::move(entry));
    }
  }
  // The next save writes the whole file again (atomically), then appends.
  rows_written_ = 0;
  columns_written_ = 0;
  if (!rows_.empty()) save();
}

}  // namespace loom
