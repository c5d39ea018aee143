#include "environment_integer.hpp"

#include <loom/errors.hpp>

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

namespace loom::detail {

std::optional<long long> whole_number(std::string_view text) noexcept {
  long long value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<long long> environment_integer(const char* name, long long minimum, long long maximum) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string_view view(text);
  const auto value = whole_number(view);
  if (!value || *value < minimum || *value > maximum) {
    throw configuration_error(std::string(name) + "='" + std::string(view) + "' is not accepted: give a whole number from " +
                              std::to_string(minimum) + " to " + std::to_string(maximum) + ", or unset it");
  }
  return value;
}

}  // namespace loom::detail
