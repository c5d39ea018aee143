// The one reader and parser of loom's environment (loom/environment.hpp):
// the only getenv and setenv of the library and its tools
// (tests/check_env_access.py keeps it so).
#include <loom/environment.hpp>
#include <loom/errors.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <string>
#include <system_error>

namespace loom::cluster {

env_lookup process_environment() {
  return [](std::string_view name) -> std::optional<std::string> {
    const char* value = std::getenv(std::string(name).c_str());
    if (value == nullptr) return std::nullopt;
    return std::string(value);
  };
}

env_lookup recorded_environment(std::map<std::string, std::string> variables) {
  return [variables = std::move(variables)](std::string_view name) -> std::optional<std::string> {
    auto it = variables.find(std::string(name));
    if (it == variables.end()) return std::nullopt;
    return it->second;
  };
}

std::optional<std::string> setting_text(std::string_view name, const env_lookup& env) {
  auto value = env(name);
  if (!value || value->empty()) return std::nullopt;
  return value;
}

namespace {

[[noreturn]] void refuse(std::string_view name, const std::string& value, const std::string& accepted) {
  throw configuration_error(std::string(name) + "='" + value + "' is not accepted: give " + accepted +
                            ", or unset it");
}

}  // namespace

std::optional<long long> whole_number(std::string_view text) noexcept {
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<long long> setting_integer(std::string_view name, long long minimum, long long maximum,
                                         const env_lookup& env) {
  const auto text = setting_text(name, env);
  if (!text) return std::nullopt;
  const auto value = whole_number(*text);
  if (!value || *value < minimum || *value > maximum) {
    refuse(name, *text, "a whole number from " + std::to_string(minimum) + " to " + std::to_string(maximum));
  }
  return value;
}

std::optional<double> setting_seconds(std::string_view name, double maximum, const env_lookup& env) {
  const auto text = setting_text(name, env);
  if (!text) return std::nullopt;
  double value = 0;
  const auto [end, error] = std::from_chars(text->data(), text->data() + text->size(), value,
                                            std::chars_format::fixed);
  // from_chars reads neither "inf" nor "nan" in the fixed format.
  if (error != std::errc{} || end != text->data() + text->size() || !std::isfinite(value) || value < 0 ||
      value > maximum) {
    std::string bound = std::to_string(maximum);
    bound.erase(bound.find_last_not_of('0') + 1);
    if (!bound.empty() && bound.back() == '.') bound.pop_back();
    refuse(name, *text, "a number of seconds from 0 to " + bound + " (such as 30 or 2.5)");
  }
  return value;
}

void export_variable(std::string_view name, const std::string& value, bool overwrite) {
  if (::setenv(std::string(name).c_str(), value.c_str(), overwrite ? 1 : 0) != 0) {
    throw configuration_error("cannot set the environment variable " + std::string(name) + " (" +
                              std::generic_category().message(errno) + ")");
  }
}

}  // namespace loom::cluster
