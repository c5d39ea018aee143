// Lightning's EarlyStopping: stops the fit when a monitored validation
// metric has not improved by min_delta for `patience` validations, or when it
// is not finite, crosses stopping_threshold (good enough) or
// divergence_threshold (hopeless). Its counters are saved in checkpoints.
#pragma once

#include <loom/callbacks/hooks.hpp>
#include <loom/trainer/hooks.hpp>
#include <loom/trainer/fit_context.hpp>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>

namespace loom {

enum class monitor_mode { min, max };

struct early_stopping_options {
  std::string monitor = "val_loss";
  double min_delta = 0.0;
  std::int64_t patience = 3;
  monitor_mode mode = monitor_mode::min;
  // A monitored metric that was never logged is an error (else: a warning, once).
  bool strict = true;
  bool check_finite = true;
  std::optional<double> stopping_threshold;
  std::optional<double> divergence_threshold;
  bool verbose = true;  // say why it stopped, on rank zero
};

class early_stopping {
 public:
  using loom_hooks = trainer_hooks;  // on_fit_start

  explicit early_stopping(early_stopping_options options = {});

  void on_fit_start(fit_context& fit) { fit_ = &fit; }
  void on_validation_end();
  void on_save_checkpoint(state& checkpoint);
  void on_load_checkpoint(state& checkpoint);

  // Checkpoint state: wait_count, stopped_epoch, best_score, patience.
  c10::IValue state_dict() const;
  void load_state_dict(const c10::IValue& value);

  double best_score() const noexcept { return best_score_; }
  std::int64_t wait_count() const noexcept { return wait_count_; }
  std::int64_t stopped_epoch() const noexcept { return stopped_epoch_; }
  // Why it stopped ("" while it has not).
  const std::string& reason() const noexcept { return reason_; }
  // The decision for one value (what on_validation_end applies); public for tests.
  bool should_stop(double current);

 private:
  bool improves(double current, double reference) const;
  std::string state_key() const { return "callbacks/early_stopping/" + options_.monitor; }

  early_stopping_options options_;
  fit_context* fit_ = nullptr;
  double best_score_;
  std::int64_t wait_count_ = 0;
  std::int64_t stopped_epoch_ = 0;
  std::string reason_;
  bool warned_missing_ = false;
};

}  // namespace loom
