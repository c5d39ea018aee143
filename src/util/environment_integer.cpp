#include "environment_integer.hpp"

#include <loom/errors.hpp>

#include <charconv>
#include <cstdlib>
#include <string>
#include <string_view>

namespace loom::detail {

std::optional<long long> environment_integer(const char* name, long long minimum, long long maximum) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return std::nullopt;
  const std::string_view view(text);
  long long value = 0;
  const auto [end, error] = std::from_chars(view.data(), view.data() + view.size(), value);
  if (error != std::errc{} || end != view.data() + view.size() || value < minimum || value > maximum) {
    throw configuration_error(std::string(name) + "='" + std::string(view) + "' is not accepted: give a whole number from " +
                              std::to_string(minimum) + " to " + std::to_string(maximum) + ", or unset it");
  }
  return value;
}

}  // namespace loom::detail
