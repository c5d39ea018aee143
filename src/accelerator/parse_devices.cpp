// Lightning's `devices` parsing (lightning/fabric/utilities/device_parser.py),
// with errors that say which form was given and which forms are accepted.
#include <loom/accelerator/parse_devices.hpp>
#include <loom/errors.hpp>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <set>
#include <sstream>

namespace loom {

bool devices_spec::is_auto() const {
  const auto* text = std::get_if<std::string>(&value_);
  return text != nullptr && *text == "auto";
}

std::string devices_spec::to_string() const {
  struct printer {
    std::string operator()(int count) const { return std::to_string(count); }
    std::string operator()(const std::string& text) const { return '"' + text + '"'; }
    std::string operator()(const std::vector<int>& indices) const {
      std::string out = "[";
      for (std::size_t i = 0; i < indices.size(); ++i) {
        if (i != 0) out += ", ";
        out += std::to_string(indices[i]);
      }
      return out + "]";
    }
  };
  return std::visit(printer{}, value_);
}

std::string devices_spec::text() const {
  if (const auto* count = std::get_if<int>(&value_)) return std::to_string(*count);
  if (const auto* raw = std::get_if<std::string>(&value_)) return *raw;
  std::string out;
  for (int index : std::get<std::vector<int>>(value_)) out += (out.empty() ? "" : ",") + std::to_string(index);
  return out;
}

namespace detail {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  return text;
}

bool parse_int(std::string_view text, int& out) {
  text = trim(text);
  if (text.empty()) return false;
  const auto* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, out);
  return ec == std::errc{} && ptr == end;
}

[[noreturn]] void refuse(const devices_spec& devices, std::string_view accelerator, std::string_view why,
                         std::string_view accepted) {
  std::ostringstream message;
  message << "devices=" << devices.to_string() << " is not valid for accelerator '" << accelerator << "': " << why
          << ". Accepted: " << accepted << '.';
  throw configuration_error(message.str());
}

constexpr std::string_view cpu_accepted = "a positive number of processes (2, \"2\") or \"auto\" (1)";
constexpr std::string_view cuda_accepted =
    "a positive count (2, \"2\": the first 2 devices), -1 or \"-1\" or \"auto\" (all devices), "
    "or device indices (\"0,1\", {0, 1})";

}  // namespace

int parse_cpu_devices(const devices_spec& devices) {
  int count = 0;
  if (devices.is_auto()) return 1;
  if (const auto* number = std::get_if<int>(&devices.value())) {
    count = *number;
  } else if (const auto* text = std::get_if<std::string>(&devices.value())) {
    if (text->find(',') != std::string::npos) {
      refuse(devices, "cpu", "CPU processes are counted, not selected by index", cpu_accepted);
    }
    if (!parse_int(*text, count)) refuse(devices, "cpu", "it is not a number", cpu_accepted);
  } else {
    refuse(devices, "cpu", "CPU processes are counted, not selected by index", cpu_accepted);
  }
  if (count <= 0) refuse(devices, "cpu", "the number of processes must be positive", cpu_accepted);
  return count;
}

std::vector<int> parse_cuda_devices(const devices_spec& devices, int available_count) {
  std::vector<int> indices;
  auto first_n = [&](int count) {
    if (count == -1) count = available_count;
    if (count == 0) refuse(devices, "cuda", "it selects no device", cuda_accepted);
    if (count < -1) refuse(devices, "cuda", "a count must be positive or -1", cuda_accepted);
    if (count > available_count) {
      refuse(devices, "cuda",
             "it asks for " + std::to_string(count) + " devices but this machine has " +
                 std::to_string(available_count),
             cuda_accepted);
    }
    for (int i = 0; i < count; ++i) indices.push_back(i);
  };
  const auto& value = devices.value();
  if (devices.is_auto()) {
    first_n(-1);
  } else if (const auto* number = std::get_if<int>(&value)) {
    first_n(*number);
  } else if (const auto* text = std::get_if<std::string>(&value)) {
    std::string_view rest = trim(*text);
    if (rest.find(',') == std::string_view::npos) {
      int count = 0;
      if (!parse_int(rest, count)) refuse(devices, "cuda", "it is not a number or a list of indices", cuda_accepted);
      first_n(count);
    } else {
      // "0,1" and "1," are index lists, as in Lightning.
      while (!rest.empty()) {
        auto comma = rest.find(',');
        auto item = trim(rest.substr(0, comma));
        rest = comma == std::string_view::npos ? std::string_view{} : rest.substr(comma + 1);
        if (item.empty()) continue;
        int index = 0;
        if (!parse_int(item, index)) refuse(devices, "cuda", "'" + std::string(item) + "' is not an index", cuda_accepted);
        indices.push_back(index);
      }
    }
  } else {
    indices = std::get<std::vector<int>>(value);
  }
  if (indices.empty()) refuse(devices, "cuda", "it selects no device", cuda_accepted);
  std::set<int> seen;
  for (int index : indices) {
    if (index < 0 || index >= available_count) {
      refuse(devices, "cuda",
             "device index " + std::to_string(index) + " does not exist (this machine has " +
                 std::to_string(available_count) + " CUDA devices)",
             cuda_accepted);
    }
    if (!seen.insert(index).second) {
      refuse(devices, "cuda", "device index " + std::to_string(index) + " is given twice", cuda_accepted);
    }
  }
  return indices;
}

}  // namespace detail
}  // namespace loom
