#include <loom/loggers/csv_logger.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
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
  if (version_) return;
  std::int64_t next = 0;
  const fs::path base = fs::path(root_dir_) / options_.name;
  std::error_code ec;
  if (fs::is_directory(base, ec)) {
    for (const auto& entry : fs::directory_iterator(base, ec)) {
      const std::string dir = entry.path().filename().string();
      if (!entry.is_directory() || dir.rfind("version_", 0) != 0) continue;
      std::int64_t number = 0;
      const char* first = dir.data() + 8;
      const char* last = dir.data() + dir.size();
      auto [ptr, err] = std::from_chars(first, last, number);
      if (err == std::errc{} && ptr == last) next = std::max(next, number + 1);
    }
  }
  version_ = next;
}

std::string csv_logger::version() const {
  resolve_version();
  if (const auto* number = std::get_if<std::int64_t>(&*version_)) return std::to_string(*number);
  return std::get<std::string>(*version_);
}

std::string csv_logger::log_dir() const {
  resolve_version();
  const std::string dir = std::holds_alternative<std::string>(*version_) ? std::get<std::string>(*version_)
                                                                          : "version_" + version();
  return (fs::path(root_dir_) / options_.name / dir).string();
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

namespace {
std::string csv_field(const std::string& text) {
  if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + '"';
}
}  // namespace

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

}  // namespace loom
