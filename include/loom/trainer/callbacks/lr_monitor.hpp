// Lightning's LearningRateMonitor: logs the learning rate of each parameter
// group as lr-<Optimizer> (lr-<Optimizer>/pg<i> for groups after the first),
// and with log_momentum its momentum or beta1 as lr-<Optimizer>-momentum,
// every log_every_n_steps optimizer steps (the lr that step used, under the
// step it produces) or at the start of every epoch.
#pragma once

#include <loom/callbacks/hooks.hpp>
#include <loom/trainer/hooks.hpp>
#include <loom/trainer/fit_context.hpp>

#include <cstdint>
#include <string>

namespace torch::optim {
class Optimizer;
}

namespace loom {

enum class logging_interval { step, epoch };

struct lr_monitor_options {
  logging_interval interval = logging_interval::step;
  bool log_momentum = false;
};

class lr_monitor {
 public:
  using loom_hooks = trainer_hooks;  // on_fit_start

  explicit lr_monitor(lr_monitor_options options = {}) : options_(options) {}

  void on_fit_start(fit_context& fit) { fit_ = &fit; }
  void on_before_optimizer_step(torch::optim::Optimizer& optimizer);
  void on_train_epoch_start(std::int64_t epoch);

  // The metrics it would log now (names as above).
  metrics current() const;

 private:
  lr_monitor_options options_;
  fit_context* fit_ = nullptr;
};

}  // namespace loom
