// Lightning's ModelCheckpoint: after each validation (or, without a monitored
// metric, each training epoch) writes the trainer's full checkpoint as
// <dirpath>/epoch=E-step=S[-<monitor>=<value>].ckpt, keeps the save_top_k
// best by the monitored metric (deleting the others it wrote), and with
// save_last also <dirpath>/last.ckpt. Its bookkeeping goes into checkpoints.
#pragma once

#include <loom/callbacks/hooks.hpp>
#include <loom/trainer/hooks.hpp>
#include <loom/trainer/callbacks/early_stopping.hpp>
#include <loom/trainer/fit_context.hpp>

#include <ATen/core/ivalue.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace loom {

struct model_checkpoint_options {
  std::string dirpath;  // "": <checkpoint_dir>/best of the trainer
  std::optional<std::string> monitor;
  monitor_mode mode = monitor_mode::min;
  // How many to keep (-1: all, 0: none but last); without monitor, the newest ones.
  std::int64_t save_top_k = 1;
  bool save_last = false;
  std::int64_t every_n_epochs = 1;
};

class model_checkpoint {
 public:
  using loom_hooks = trainer_hooks;  // on_fit_start

  explicit model_checkpoint(model_checkpoint_options options = {});

  void on_fit_start(fit_context& fit);
  void on_validation_end();
  void on_train_epoch_end(std::int64_t epoch);
  void on_save_checkpoint(state& checkpoint);
  void on_load_checkpoint(state& checkpoint);

  c10::IValue state_dict() const;
  void load_state_dict(const c10::IValue& value);

  const std::string& best_model_path() const noexcept { return best_model_path_; }
  std::optional<double> best_model_score() const noexcept { return best_model_score_; }
  const std::string& last_model_path() const noexcept { return last_model_path_; }
  // Kept checkpoint -> its score (the step, without a monitor).
  const std::map<std::string, double>& best_k_models() const noexcept { return best_k_models_; }
  const std::string& dirpath() const noexcept { return dirpath_; }

 private:
  void save(double score, bool has_metric);
  bool better(double a, double b) const;

  model_checkpoint_options options_;
  fit_context* fit_ = nullptr;
  std::string dirpath_;
  std::map<std::string, double> best_k_models_;
  std::string best_model_path_;
  std::optional<double> best_model_score_;
  std::string last_model_path_;
  std::int64_t last_saved_step_ = -1;
};

}  // namespace loom
