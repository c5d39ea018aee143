#include "outside_json.hpp"

#include <loom/errors.hpp>

#include <set>
#include <vector>

namespace loom::detail {

nlohmann::json parse_outside_json(const std::string& text, const std::string& what) {
  using json = nlohmann::json;
  // One entry per open container: the keys an object has given so far (an
  // array's entry stays empty).
  std::vector<std::set<std::string>> open;
  auto check = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start:
        if (static_cast<int>(open.size()) >= outside_json_depth_limit) {
          throw configuration_error(what + " nests deeper than " + std::to_string(outside_json_depth_limit) +
                                    " levels of objects and arrays (refused: no config needs that)");
        }
        open.emplace_back();
        break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!open.empty()) open.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open.empty() && !open.back().insert(parsed.get<std::string>()).second) {
          throw configuration_error(what + " gives the key '" + parsed.get<std::string>() +
                                    "' twice in one object (which value is meant cannot be told; keep one)");
        }
        break;
      case json::parse_event_t::value: break;
    }
    return true;
  };
  try {
    return json::parse(text, check);
  } catch (const json::exception& error) {
    // parse_error, and out_of_range for a number no double holds (1E1111...):
    // every nlohmann refusal of the text is the config's error.
    throw configuration_error(what + " is not valid JSON: " + error.what());
  }
}

}  // namespace loom::detail
