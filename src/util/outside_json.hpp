// JSON from outside (DeepSpeed configs, strategy option files), parsed with
// the limits a file from outside needs. Internal to src/.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace loom::detail {

// The deepest nesting accepted: far beyond any config, far below what
// nlohmann's recursive dump and comparisons survive (10^5 levels overflow
// the stack).
inline constexpr int outside_json_depth_limit = 64;

// text parsed, refused with a configuration_error that starts with `what`
// ("deepspeed config (path)") when it is not valid JSON, nests deeper than
// outside_json_depth_limit, or gives one object a key twice (nlohmann would
// keep the last silently; which one the writer meant is unknown).
nlohmann::json parse_outside_json(const std::string& text, const std::string& what);

}  // namespace loom::detail
