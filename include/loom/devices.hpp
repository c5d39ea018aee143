// `devices` as Lightning accepts it: a count, "auto", a string such as "2" or
// "0,1", or a list of indices. Accelerators turn it into a device_selection.
#pragma once

#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

namespace loom {

class devices_spec {
 public:
  using value_type = std::variant<int, std::string, std::vector<int>>;

  // Not given: one device for a single-process strategy; for a distributed
  // one started by an external launcher, what that launcher started.
  devices_spec() : value_(1), given_(false) {}
  devices_spec(int count) : value_(count) {}  // NOLINT: implicit, as in Lightning
  devices_spec(const char* text) : value_(std::string(text)) {}  // NOLINT
  devices_spec(std::string text) : value_(std::move(text)) {}  // NOLINT
  devices_spec(std::initializer_list<int> indices) : value_(std::vector<int>(indices)) {}
  devices_spec(std::vector<int> indices) : value_(std::move(indices)) {}  // NOLINT

  const value_type& value() const noexcept { return value_; }
  bool is_auto() const;
  bool given() const noexcept { return given_; }
  // As the user wrote it, for error messages: 2, "0,1", [0, 1].
  std::string to_string() const;
  // As a command-line value: 2, 0,1, auto.
  std::string text() const;

 private:
  value_type value_;
  bool given_ = true;
};

// What an accelerator resolved `devices` to: one entry per local process.
// On cpu the entries are -1 (processes, not device indices).
struct device_selection {
  std::vector<int> indices;
  int count() const noexcept { return static_cast<int>(indices.size()); }
};

}  // namespace loom
