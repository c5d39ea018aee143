// Lightning's run directories: <root_dir>/<name>/version_<n>, where n is the
// next free number unless a version is given. Shared by the file loggers.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <variant>

namespace loom {

// An explicit version: a number (version_<n>) or a directory name used as is.
using log_version = std::variant<std::int64_t, std::string>;

// 1 + the greatest n of the version_<n> directories in dir (0 when none).
std::int64_t next_log_version(const std::string& dir);

// <root_dir>/<name>/<version_n or the given name>.
std::string versioned_log_dir(const std::string& root_dir, const std::string& name, const log_version& version);

}  // namespace loom
