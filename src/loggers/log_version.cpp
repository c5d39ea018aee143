#include <loom/loggers/log_version.hpp>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <system_error>

namespace loom {

namespace fs = std::filesystem;

std::int64_t next_log_version(const std::string& dir) {
  std::int64_t next = 0;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return next;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || name.rfind("version_", 0) != 0) continue;
    std::int64_t number = 0;
    const char* first = name.data() + 8;
    const char* last = name.data() + name.size();
    auto [ptr, err] = std::from_chars(first, last, number);
    if (err == std::errc{} && ptr == last) next = std::max(next, number + 1);
  }
  return next;
}

std::string versioned_log_dir(const std::string& root_dir, const std::string& name, const log_version& version) {
  const std::string leaf = std::holds_alternative<std::string>(version)
                               ? std::get<std::string>(version)
                               : "version_" + std::to_string(std::get<std::int64_t>(version));
  return (fs::path(root_dir) / name / leaf).string();
}

}  // namespace loom
