// Learning-rate schedulers with state, for checkpoints and exact resume.
// LibTorch 1.13's C++ API has only StepLR, without save or load; these follow
// torch.optim.lr_scheduler's rules step for step (the same chained products,
// the same closed forms), so a schedule gives the numbers Python gives.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace loom {

// torch.optim.lr_scheduler.StepLR: lr *= gamma every step_size steps.
struct step_lr {
  std::int64_t step_size = 1;
  double gamma = 0.1;
};

// torch's MultiStepLR: lr *= gamma at each milestone (a repeated milestone
// multiplies once per repetition, as torch's Counter does).
struct multi_step_lr {
  std::vector<std::int64_t> milestones;
  double gamma = 0.1;
};

// Linear warm-up from warmup_start_factor * lr to lr over warmup_steps, then
// cosine decay to min_lr_factor * lr at total_steps (held there after). As
// torch's LambdaLR with that factor: lr = base_lr * factor(step).
struct cosine_warmup_lr {
  std::int64_t warmup_steps = 0;
  std::int64_t total_steps = 1;
  double warmup_start_factor = 0.0;
  double min_lr_factor = 0.0;
};

// torch's OneCycleLR (Smith's one-cycle policy): from max_lr / div_factor up
// to max_lr over pct_start of total_steps, then down to
// max_lr / div_factor / final_div_factor; momentum (SGD) or beta1 (Adam,
// AdamW) cycles the other way when cycle_momentum. Stepping past total_steps
// is an error, as in torch.
struct one_cycle_lr {
  enum class anneal { cos, linear };
  double max_lr = 0.0;
  std::int64_t total_steps = 0;
  double pct_start = 0.3;
  anneal anneal_strategy = anneal::cos;
  bool cycle_momentum = true;
  double base_momentum = 0.85;
  double max_momentum = 0.95;
  double div_factor = 25.0;
  double final_div_factor = 1e4;
  bool three_phase = false;
};

// torch's LambdaLR: lr = base_lr * factor(step). The function is not saved
// (as in torch); the step count is.
struct lambda_lr {
  std::function<double(std::int64_t step)> factor;
};

using lr_schedule = std::variant<step_lr, multi_step_lr, cosine_warmup_lr, one_cycle_lr, lambda_lr>;

class lr_scheduler {
 public:
  // Binds to optimizer (which must outlive it) and, as torch's constructors
  // do, takes the first step: the groups' lrs become the schedule's value at
  // step 0. Invalid options are loom::configuration_error.
  lr_scheduler(torch::optim::Optimizer& optimizer, lr_schedule schedule);

  // One more step: last_epoch + 1, and the groups' lrs (and momentum, for
  // one-cycle) set to the schedule's values there.
  void step();

  // torch's names: the step count (starts at 0 after construction) and the
  // lrs the last step set.
  std::int64_t last_epoch() const noexcept { return last_epoch_; }
  const std::vector<double>& get_last_lr() const noexcept { return last_lr_; }
  const std::vector<double>& base_lrs() const noexcept { return base_lrs_; }
  // "StepLR", "MultiStepLR", "CosineWarmupLR", "OneCycleLR", "LambdaLR".
  std::string_view name() const noexcept;
  const lr_schedule& schedule() const noexcept { return schedule_; }

  // {"last_epoch", "base_lrs", "last_lr", "schedule"}; loading checks the
  // schedule's name and the number of groups, then sets the groups' lrs.
  c10::IValue state_dict() const;
  void load_state_dict(const c10::IValue& state);

 private:
  struct values {
    std::vector<double> lrs;
    std::vector<double> momenta;  // one-cycle with cycle_momentum only
  };
  values compute(std::int64_t epoch) const;
  void apply(const values& next);

  torch::optim::Optimizer* optimizer_;
  lr_schedule schedule_;
  std::vector<double> base_lrs_;
  std::vector<double> last_lr_;
  std::int64_t last_epoch_ = -1;
};

// The lr of each parameter group (what an LR monitor logs).
std::vector<double> learning_rates(const torch::optim::Optimizer& optimizer);
// Momentum (SGD, RMSprop) or beta1 (Adam, AdamW) of each group; empty when
// the optimizer has neither.
std::vector<double> momenta(const torch::optim::Optimizer& optimizer);

}  // namespace loom
