// What a Fabric offers that no policy decides: loggers (rank zero writes)
// and callbacks. One implementation for the static and the erased Fabric.
#pragma once

#include <loom/callbacks/callback.hpp>
#include <loom/errors.hpp>
#include <loom/loggers/logger.hpp>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <iostream>
#include <sstream>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom::detail {

// A value Fabric.log accepts: a number or a one-element tensor.
inline metric_value to_metric(const at::Tensor& value) {
  if (value.numel() != 1) {
    throw configuration_error("fabric.log: a logged tensor must hold one element, this one has " +
                              std::to_string(value.numel()));
  }
  if (value.is_floating_point()) return value.item<double>();
  if (value.scalar_type() == at::kBool) return static_cast<std::int64_t>(value.item<bool>());
  return value.item<std::int64_t>();
}
template <class T>
metric_value to_metric(const T& value) {
  if constexpr (std::is_integral_v<T>) return static_cast<std::int64_t>(value);
  else return static_cast<double>(value);
}

// Fabric.print: its arguments, separated by spaces, on global rank zero.
template <class... Args>
void print_on_zero(bool global_zero, const Args&... args) {
  if (!global_zero) return;
  std::ostringstream line;
  bool first = true;
  ((line << (first ? "" : " ") << args, first = false), ...);
  line << '\n';
  std::cout << line.str() << std::flush;
}

// Fabric.rank_zero_first(): rank zero runs the guarded block first, the
// others wait at a barrier until it is done.
template <class FabricType>
class [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] rank_zero_first_guard {
 public:
  explicit rank_zero_first_guard(FabricType& fabric) : fabric_(&fabric) {
    if (!fabric_->is_global_zero()) fabric_->barrier();
  }
  rank_zero_first_guard(const rank_zero_first_guard&) = delete;
  rank_zero_first_guard& operator=(const rank_zero_first_guard&) = delete;
  ~rank_zero_first_guard() {
    if (fabric_->is_global_zero()) fabric_->barrier();
  }

 private:
  FabricType* fabric_;
};

class fabric_services {
 public:
  fabric_services(std::vector<logger> loggers, std::vector<callback> callbacks) : loggers_(std::move(loggers)) {
    for (auto& entry : callbacks) callbacks_.add(std::move(entry));
  }

  // To every logger, when this process is global rank zero.
  template <class Value>
  void log(bool global_zero, const std::string& name, const Value& value, std::optional<std::int64_t> step) {
    if (!global_zero || loggers_.empty()) return;
    const metrics values{{name, to_metric(value)}};
    for (auto& sink : loggers_) sink.log_metrics(values, step);
  }
  void log_dict(bool global_zero, const metrics& values, std::optional<std::int64_t> step) {
    if (!global_zero) return;
    for (auto& sink : loggers_) sink.log_metrics(values, step);
  }
  std::vector<logger>& loggers() noexcept { return loggers_; }
  logger& first_logger() {
    if (loggers_.empty()) throw configuration_error("fabric has no logger; pass fabric_options{.loggers = {...}}");
    return loggers_.front();
  }

  void add_callback(callback entry) { callbacks_.add(std::move(entry)); }
  const std::vector<callback>& callbacks() const noexcept { return callbacks_.callbacks(); }
  template <class Hook, class... Args>
  void call(Args&&... args) {
    callbacks_.template call<Hook>(std::forward<Args>(args)...);
  }

 private:
  std::vector<logger> loggers_;
  callback_registry callbacks_;
};

}  // namespace loom::detail
