// option_reader over nlohmann-json.
#include <loom/errors.hpp>
#include <loom/runtime/strategy_options.hpp>

#include <nlohmann/json.hpp>

#include "../util/outside_files.hpp"
#include "../util/outside_json.hpp"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

namespace loom::runtime {

struct option_reader::parsed {
  nlohmann::json object = nlohmann::json::object();
};

namespace {
std::string shown(const nlohmann::json& value) {
  std::string text = value.dump();
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}

std::string number_text(double value) {
  std::ostringstream out;
  out << value;
  return out.str();
}
// An options file is a small JSON object: larger than this, it is not one.
constexpr std::size_t options_file_limit = std::size_t{16} << 20;

[[noreturn]] void refuse_options_file(const std::string& path, const std::string& why) {
  throw configuration_error("strategy options file " + path + ": it " + why);
}

}  // namespace

option_reader::option_reader(std::string strategy, std::string_view text)
    : strategy_(std::move(strategy)), parsed_(std::make_unique<parsed>()) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return;
  std::string json_text(text);
  std::string origin = "the strategy options";
  if (text[first] != '{') {
    const auto bytes = loom::detail::read_regular_file(std::string(text), options_file_limit, &refuse_options_file);
    if (!bytes) {
      throw configuration_error("strategy '" + strategy_ + "': the options are neither a JSON object ('{...}') nor "
                                "a readable file: '" + std::string(text) + "'");
    }
    json_text.assign(bytes->begin(), bytes->end());
    origin = "the options file " + std::string(text);
  }
  parsed_->object = loom::detail::parse_outside_json(json_text, "strategy '" + strategy_ + "': " + origin);
  if (!parsed_->object.is_object()) {
    throw configuration_error("strategy '" + strategy_ + "': " + origin + " must be a JSON object of option names "
                              "and values, got " + shown(parsed_->object));
  }
}

option_reader::~option_reader() = default;

void option_reader::read(std::string_view key, bool& value) {
  asked_.emplace_back(key);
  auto found = parsed_->object.find(std::string(key));
  if (found == parsed_->object.end()) return;
  if (!found->is_boolean()) {
    throw configuration_error("strategy '" + strategy_ + "': option '" + std::string(key) + "' = " + shown(*found) +
                              " is not accepted: expected true or false");
  }
  value = found->get<bool>();
}

void option_reader::read(std::string_view key, double& value, double greater_than, double at_most) {
  asked_.emplace_back(key);
  auto found = parsed_->object.find(std::string(key));
  if (found == parsed_->object.end()) return;
  const bool in_range = found->is_number() && found->get<double>() > greater_than && found->get<double>() <= at_most;
  if (!in_range) {
    throw configuration_error("strategy '" + strategy_ + "': option '" + std::string(key) + "' = " + shown(*found) +
                              " is not accepted: expected a number > " + number_text(greater_than) +
                              (std::isinf(at_most) ? std::string() : " and <= " + number_text(at_most)));
  }
  value = found->get<double>();
}

void option_reader::read_seconds(std::string_view key, std::chrono::milliseconds& value, std::string_view zero_means) {
  asked_.emplace_back(key);
  auto found = parsed_->object.find(std::string(key));
  if (found == parsed_->object.end()) return;
  constexpr double most = 1e9;
  const bool zero_allowed = !zero_means.empty();
  const bool in_range = found->is_number() && found->get<double>() <= most &&
                        (found->get<double>() > 0 || (zero_allowed && found->get<double>() == 0));
  if (!in_range) {
    throw configuration_error("strategy '" + strategy_ + "': option '" + std::string(key) + "' = " + shown(*found) +
                              " is not accepted: expected a number of seconds " +
                              (zero_allowed ? ">= 0 (0: " + std::string(zero_means) + ")" : std::string("> 0")) +
                              " and <= " + number_text(most));
  }
  value = std::chrono::milliseconds(std::llround(found->get<double>() * 1000.0));
}

void option_reader::read(std::string_view key, std::int64_t& value, std::int64_t at_least, std::int64_t at_most) {
  asked_.emplace_back(key);
  auto found = parsed_->object.find(std::string(key));
  if (found == parsed_->object.end()) return;
  const bool in_range = found->is_number_integer() && found->get<std::int64_t>() >= at_least &&
                        found->get<std::int64_t>() <= at_most;
  if (!in_range) {
    throw configuration_error("strategy '" + strategy_ + "': option '" + std::string(key) + "' = " + shown(*found) +
                              " is not accepted: expected an integer from " + std::to_string(at_least) + " to " +
                              std::to_string(at_most));
  }
  value = found->get<std::int64_t>();
}

void option_reader::read(std::string_view key, std::string& value, std::initializer_list<std::string_view> accepted) {
  asked_.emplace_back(key);
  auto found = parsed_->object.find(std::string(key));
  if (found == parsed_->object.end()) return;
  const bool known = found->is_string() && std::find(accepted.begin(), accepted.end(),
                                                     found->get<std::string>()) != accepted.end();
  if (!known) {
    std::string list;
    for (auto option : accepted) list += (list.empty() ? "\"" : ", \"") + std::string(option) + "\"";
    throw configuration_error("strategy '" + strategy_ + "': option '" + std::string(key) + "' = " + shown(*found) +
                              " is not accepted: expected one of " + list);
  }
  value = found->get<std::string>();
}

void option_reader::read(std::string_view key, std::vector<std::string>& value) {
  asked_.emplace_back(key);
  auto found = parsed_->object.find(std::string(key));
  if (found == parsed_->object.end()) return;
  const bool strings = found->is_array() && std::all_of(found->begin(), found->end(),
                                                          [](const nlohmann::json& item) { return item.is_string(); });
  if (!strings) {
    throw configuration_error("strategy '" + strategy_ + "': option '" + std::string(key) + "' = " + shown(*found) +
                              " is not accepted: expected a list of strings");
  }
  value = found->get<std::vector<std::string>>();
}

void option_reader::read(std::string_view key, std::string& value) {
  asked_.emplace_back(key);
  auto found = parsed_->object.find(std::string(key));
  if (found == parsed_->object.end()) return;
  if (!found->is_string() || found->get<std::string>().empty()) {
    throw configuration_error("strategy '" + strategy_ + "': option '" + std::string(key) + "' = " + shown(*found) +
                              " is not accepted: expected a non-empty string");
  }
  value = found->get<std::string>();
}

void option_reader::read_object_or_path(std::string_view key, std::string& value) {
  asked_.emplace_back(key);
  auto found = parsed_->object.find(std::string(key));
  if (found == parsed_->object.end()) return;
  if (found->is_object()) {
    value = found->dump();
    return;
  }
  if (!found->is_string() || found->get<std::string>().empty()) {
    throw configuration_error("strategy '" + strategy_ + "': option '" + std::string(key) + "' = " + shown(*found) +
                              " is not accepted: expected a JSON object or the path of a JSON file");
  }
  value = found->get<std::string>();
}

void option_reader::finish() const {
  for (const auto& [key, value] : parsed_->object.items()) {
    if (std::find(asked_.begin(), asked_.end(), key) != asked_.end()) continue;
    std::string list;
    for (const auto& known : asked_) list += (list.empty() ? "" : ", ") + known;
    throw configuration_error("strategy '" + strategy_ + "': unknown option '" + key + "' = " + shown(value) +
                              "; accepted: " + (list.empty() ? std::string("none (it takes no options)") : list));
  }
}

}  // namespace loom::runtime
