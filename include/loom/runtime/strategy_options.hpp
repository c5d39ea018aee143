// A strategy's options as the run-time layer receives them (make_fabric's
// strategy_options: a JSON object, or the path of a file holding one): each
// registered preset reads the keys it knows, and every key left unread is an
// error naming the strategy, the key, its value and the keys accepted. The
// JSON library stays in src/: this header needs none.
#pragma once

#include <chrono>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace loom::runtime {

class option_reader {
 public:
  // text: empty (no options), a JSON object ("{...}"), or a path to a file
  // holding one. Throws loom::configuration_error when it is neither.
  option_reader(std::string strategy, std::string_view text);
  ~option_reader();
  option_reader(const option_reader&) = delete;
  option_reader& operator=(const option_reader&) = delete;

  // Each leaves value as it is when the key is absent; a value of the wrong
  // type or out of range is an error that says what is accepted.
  void read(std::string_view key, bool& value);
  void read(std::string_view key, double& value, double greater_than, double at_most);
  // A duration in seconds (as Lightning's timedelta options), up to 10^9 s:
  // > 0, or >= 0 when zero_means says what 0 does ("the watchdog off").
  void read_seconds(std::string_view key, std::chrono::milliseconds& value, std::string_view zero_means = {});
  void read(std::string_view key, std::int64_t& value, std::int64_t at_least, std::int64_t at_most);
  void read(std::string_view key, std::string& value, std::initializer_list<std::string_view> accepted);
  // A list of strings (["Linear", "torch::nn::Conv2dImpl"]).
  void read(std::string_view key, std::vector<std::string>& value);
  // Any non-empty string (a path).
  void read(std::string_view key, std::string& value);
  // A JSON object (kept as its text) or a string (a file's path): DeepSpeed's config.
  void read_object_or_path(std::string_view key, std::string& value);

  // Throws when the options hold a key no read() asked for.
  void finish() const;
  const std::string& strategy() const noexcept { return strategy_; }

 private:
  struct parsed;
  std::string strategy_;
  std::unique_ptr<parsed> parsed_;
  std::vector<std::string> asked_;
};

}  // namespace loom::runtime
