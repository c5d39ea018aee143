// A logger of any type that has log_metrics (and optionally log_hyperparams,
// save, finalize, log_dir, resume). Loggers are off the hot path: type
// erasure is fine here.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <typeinfo>
#include <utility>
#include <variant>
#include <vector>

namespace loom {

// A logged number keeps its kind: integers print as integers, as in Python.
using metric_value = std::variant<std::int64_t, double>;
// Name -> value, in the order they were logged.
using metrics = std::vector<std::pair<std::string, metric_value>>;
using hyperparameter = std::variant<bool, std::int64_t, double, std::string>;
using hyperparameters = std::vector<std::pair<std::string, hyperparameter>>;

// What a type needs to be held by loom::logger (a type-erased holder, the
// element of fabric_options::loggers): log_metrics(metrics, step).
template <class L>
concept MetricsLogger = requires(L& logger, const metrics& values, std::optional<std::int64_t> step) {
  logger.log_metrics(values, step);
};

class logger {
 public:
  template <MetricsLogger L>
    requires(!std::is_same_v<std::remove_cvref_t<L>, logger>)
  logger(L&& value)  // NOLINT: implicit, so `.loggers = {loom::csv_logger("logs")}` reads naturally
      : self_(std::make_shared<model<std::remove_cvref_t<L>>>(std::forward<L>(value))) {}
  template <MetricsLogger L>
  logger(std::shared_ptr<L> shared) : self_(std::make_shared<model<std::shared_ptr<L>>>(std::move(shared))) {}  // NOLINT

  void log_metrics(const metrics& values, std::optional<std::int64_t> step) { self_->log_metrics(values, step); }
  void log_hyperparams(const hyperparameters& values) { self_->log_hyperparams(values); }
  void save() { self_->save(); }
  void finalize(std::string_view status) { self_->finalize(status); }
  // Where it writes, for loggers that write files (else empty).
  std::string log_dir() const { return self_->log_dir(); }
  // Continue a run resumed from a checkpoint taken at `step`, written to
  // log_dir: what was logged after that step is dropped, logging appends.
  // Loggers without resume(log_dir, step) start afresh.
  void resume(const std::string& log_dir, std::int64_t step) { self_->resume(log_dir, step); }

  // The logger object, when it is an L (nullptr otherwise).
  template <class L>
  L* get() const noexcept {
    return static_cast<L*>(self_->target(typeid(L)));
  }

 private:
  struct concept_t {
    virtual ~concept_t() = default;
    virtual void log_metrics(const metrics& values, std::optional<std::int64_t> step) = 0;
    virtual void log_hyperparams(const hyperparameters& values) = 0;
    virtual void save() = 0;
    virtual void finalize(std::string_view status) = 0;
    virtual std::string log_dir() = 0;
    virtual void resume(const std::string& log_dir, std::int64_t step) = 0;
    virtual void* target(const std::type_info& type) noexcept = 0;
  };

  template <class Held>
  struct model final : concept_t {
    explicit model(Held value) : held(std::move(value)) {}
    auto& get() {
      if constexpr (requires { held.get(); typename Held::element_type; }) return *held;
      else return held;
    }
    void log_metrics(const metrics& values, std::optional<std::int64_t> step) override {
      get().log_metrics(values, step);
    }
    void log_hyperparams(const hyperparameters& values) override {
      if constexpr (requires { get().log_hyperparams(values); }) {
        get().log_hyperparams(values);
      } else {
        throw std::logic_error(std::string("this logger (") + typeid(get()).name() +
                               ") does not log hyperparameters");
      }
    }
    void save() override {
      if constexpr (requires { get().save(); }) get().save();
    }
    void finalize(std::string_view status) override {
      if constexpr (requires { get().finalize(status); }) get().finalize(status);
    }
    std::string log_dir() override {
      if constexpr (requires { std::string(get().log_dir()); }) return std::string(get().log_dir());
      else return {};
    }
    void resume(const std::string& log_dir, std::int64_t step) override {
      if constexpr (requires { get().resume(log_dir, step); }) get().resume(log_dir, step);
    }
    void* target(const std::type_info& type) noexcept override {
      auto& object = get();
      return typeid(object) == type ? static_cast<void*>(&object) : nullptr;
    }
    Held held;
  };

  std::shared_ptr<concept_t> self_;
};

}  // namespace loom
