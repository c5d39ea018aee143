#include <loom/trainer/checkpoint_files.hpp>

#include <filesystem>
#include <regex>
#include <system_error>
#include <tuple>

namespace loom {

std::string checkpoint_file_name(const std::string& dir, std::int64_t epoch, std::int64_t step) {
  return (std::filesystem::path(dir) / ("epoch=" + std::to_string(epoch) + "-step=" + std::to_string(step) + ".ckpt"))
      .string();
}

std::optional<std::string> latest_checkpoint(const std::string& dir) {
  namespace fs = std::filesystem;
  static const std::regex pattern(R"(epoch=(\d+)-step=(\d+)\.ckpt)");
  std::optional<std::string> best;
  std::tuple<std::int64_t, std::int64_t> best_key{-1, -1};
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch match;
    const std::string name = entry.path().filename().string();
    // A file, or a sharded checkpoint's directory (it holds meta.pt).
    const bool checkpoint = entry.is_regular_file(ec) || fs::exists(entry.path() / "meta.pt", ec);
    if (!checkpoint || !std::regex_match(name, match, pattern)) continue;
    const std::tuple<std::int64_t, std::int64_t> key{std::stoll(match[2]), std::stoll(match[1])};
    if (key > best_key) {
      best_key = key;
      best = entry.path().string();
    }
  }
  return best;
}

}  // namespace loom
