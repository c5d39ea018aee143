// What callbacks see of a running fit: counters, the latest metrics, the
// optimizer and scheduler, and the few actions a callback may take (stop,
// save a checkpoint, log). The trainer hands it to on_fit_start; it stays
// valid until fit returns. Lightning passes its Trainer to every hook; this
// is the part of it a C++ callback needs, without a dependency on the
// trainer's template parameters.
#pragma once

#include <loom/loggers/logger.hpp>

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

namespace torch::optim {
class Optimizer;
}

namespace loom {

class lr_scheduler;
template <class>
class trainer;
namespace detail {
template <class, class, class, class, class>
class fit_loop;
}

class fit_context {
 public:
  // Epochs finished, optimizer steps taken, batches of the current epoch done.
  std::int64_t epoch() const noexcept { return epoch_; }
  std::int64_t global_step() const noexcept { return global_step_; }
  std::int64_t batch_in_epoch() const noexcept { return batch_in_epoch_; }
  bool is_global_zero() const noexcept { return global_rank_ == 0; }
  int global_rank() const noexcept { return global_rank_; }
  int world_size() const noexcept { return world_size_; }
  const std::string& checkpoint_dir() const noexcept { return checkpoint_dir_; }

  // The latest value of every logged metric (training steps on this rank,
  // validation epochs reduced over all ranks): Lightning's callback_metrics.
  const std::map<std::string, double>& metrics() const noexcept { return metrics_; }
  std::optional<double> metric(std::string_view name) const {
    auto it = metrics_.find(std::string(name));
    return it == metrics_.end() ? std::nullopt : std::optional<double>(it->second);
  }

  torch::optim::Optimizer& optimizer() const noexcept { return *optimizer_; }
  // nullptr when configure_optimizers returned no scheduler.
  const lr_scheduler* scheduler() const noexcept { return scheduler_; }

  // Ends the fit at the next safe point: after the current optimizer step
  // (never inside an accumulation window), or before the next epoch.
  void request_stop() noexcept { stop_requested_ = true; }
  bool stop_requested() const noexcept { return stop_requested_; }

  // Writes the trainer's full checkpoint (model, optimizer, scheduler,
  // counters, RNG, callbacks) to path. A collective: every rank calls it,
  // with the same path; global rank zero writes.
  void save_checkpoint(const std::string& path) const {
    if (!save_) throw std::logic_error("fit_context::save_checkpoint: no fit is running");
    save_(path);
  }
  // To the loggers, on global rank zero, at the current global step or at step.
  void log(const loom::metrics& values) const { log(values, global_step_); }
  void log(const loom::metrics& values, std::int64_t step) const {
    if (!log_) throw std::logic_error("fit_context::log: no fit is running");
    log_(values, step);
  }
  // The trainer's log_every_n_steps: callbacks that log per step keep its cadence.
  std::int64_t log_every_n_steps() const noexcept { return log_every_n_steps_; }

 private:
  template <class>
  friend class trainer;
  template <class, class, class, class, class>
  friend class detail::fit_loop;

  std::int64_t epoch_ = 0;
  std::int64_t global_step_ = 0;
  std::int64_t batch_in_epoch_ = 0;
  int global_rank_ = 0;
  int world_size_ = 1;
  std::string checkpoint_dir_;
  std::map<std::string, double> metrics_;
  torch::optim::Optimizer* optimizer_ = nullptr;
  const lr_scheduler* scheduler_ = nullptr;
  bool stop_requested_ = false;
  std::function<void(const std::string&)> save_;
  std::function<void(const loom::metrics&, std::int64_t)> log_;
  std::int64_t log_every_n_steps_ = 1;
};

}  // namespace loom
