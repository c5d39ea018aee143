#include <loom/errors.hpp>
#include <loom/trainer/lr_scheduler.hpp>

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <string>
#include <tuple>

namespace loom {

namespace {

template <class... F>
struct overloaded : F... {
  using F::operator()...;
};
template <class... F>
overloaded(F...) -> overloaded<F...>;

// Where a group keeps its momentum: SGD and RMSprop have `momentum`, Adam and
// AdamW have beta1 (torch's OneCycleLR checks the same two).
enum class momentum_kind { none, momentum, beta1 };

momentum_kind momentum_of(torch::optim::OptimizerOptions& options) {
  if (dynamic_cast<torch::optim::SGDOptions*>(&options) || dynamic_cast<torch::optim::RMSpropOptions*>(&options)) {
    return momentum_kind::momentum;
  }
  if (dynamic_cast<torch::optim::AdamOptions*>(&options) || dynamic_cast<torch::optim::AdamWOptions*>(&options)) {
    return momentum_kind::beta1;
  }
  return momentum_kind::none;
}

double read_momentum(torch::optim::OptimizerOptions& options) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) return sgd->momentum();
  if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) return rms->momentum();
  if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options)) return std::get<0>(adam->betas());
  if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options)) return std::get<0>(adamw->betas());
  return 0.0;
}

void write_momentum(torch::optim::OptimizerOptions& options, double value) {
  if (auto* sgd = dynamic_cast<torch::optim::SGDOptions*>(&options)) sgd->momentum(value);
  else if (auto* rms = dynamic_cast<torch::optim::RMSpropOptions*>(&options)) rms->momentum(value);
  else if (auto* adam = dynamic_cast<torch::optim::AdamOptions*>(&options))
    adam->betas(std::make_tuple(value, std::get<1>(adam->betas())));
  else if (auto* adamw = dynamic_cast<torch::optim::AdamWOptions*>(&options))
    adamw->betas(std::make_tuple(value, std::get<1>(adamw->betas())));
}

// torch's OneCycleLR._annealing_cos / _annealing_linear.
double anneal(one_cycle_lr::anneal strategy, double start, double end, double pct) {
  if (strategy == one_cycle_lr::anneal::cos) {
    const double cos_out = std::cos(std::numbers::pi * pct) + 1;
    return end + (start - end) / 2.0 * cos_out;
  }
  return (end - start) * pct + start;
}

void check(bool ok, const std::string& message) {
  if (!ok) throw configuration_error(message);
}

void validate(const lr_schedule& schedule, torch::optim::Optimizer& optimizer) {
  std::visit(overloaded{
                 [](const step_lr& s) {
                   check(s.step_size > 0, "step_lr: step_size must be positive, got " + std::to_string(s.step_size));
                 },
                 [](const multi_step_lr& s) {
                   check(std::is_sorted(s.milestones.begin(), s.milestones.end()),
                         "multi_step_lr: milestones must be in increasing order");
                 },
                 [](const cosine_warmup_lr& s) {
                   check(s.warmup_steps >= 0 && s.total_steps > s.warmup_steps,
                         "cosine_warmup_lr: needs 0 <= warmup_steps < total_steps, got warmup_steps=" +
                             std::to_string(s.warmup_steps) + ", total_steps=" + std::to_string(s.total_steps));
                 },
                 [&optimizer](const one_cycle_lr& s) {
                   check(s.total_steps > 0,
                         "one_cycle_lr: total_steps must be a positive integer, got " + std::to_string(s.total_steps));
                   check(s.max_lr > 0, "one_cycle_lr: max_lr must be positive");
                   check(s.pct_start >= 0 && s.pct_start <= 1,
                         "one_cycle_lr: pct_start must be between 0 and 1, got " + std::to_string(s.pct_start));
                   if (s.cycle_momentum) {
                     for (auto& group : optimizer.param_groups()) {
                       check(momentum_of(group.options()) != momentum_kind::none,
                             "one_cycle_lr: cycle_momentum needs an optimizer with momentum (SGD, RMSprop) or betas "
                             "(Adam, AdamW); set cycle_momentum = false for this one");
                     }
                   }
                 },
                 [](const lambda_lr& s) { check(static_cast<bool>(s.factor), "lambda_lr: factor is empty"); },
             },
             schedule);
}

}  // namespace

lr_scheduler::lr_scheduler(torch::optim::Optimizer& optimizer, lr_schedule schedule)
    : optimizer_(&optimizer), schedule_(std::move(schedule)) {
  validate(schedule_, optimizer);
  if (const auto* cycle = std::get_if<one_cycle_lr>(&schedule_)) {
    // torch: initial_lr = max_lr / div_factor; momentum starts at max_momentum.
    for (auto& group : optimizer.param_groups()) {
      base_lrs_.push_back(cycle->max_lr / cycle->div_factor);
      if (cycle->cycle_momentum) write_momentum(group.options(), cycle->max_momentum);
    }
  } else {
    for (auto& group : optimizer.param_groups()) base_lrs_.push_back(group.options().get_lr());
  }
  step();  // torch's _initial_step
}

lr_scheduler::values lr_scheduler::compute(std::int64_t epoch) const {
  values next;
  const auto& groups = optimizer_->param_groups();
  next.lrs.reserve(groups.size());
  std::visit(
      overloaded{
          [&](const step_lr& s) {
            for (const auto& group : groups) {
              const double lr = group.options().get_lr();
              next.lrs.push_back(epoch == 0 || epoch % s.step_size != 0 ? lr : lr * s.gamma);
            }
          },
          [&](const multi_step_lr& s) {
            const auto hits = std::count(s.milestones.begin(), s.milestones.end(), epoch);
            for (const auto& group : groups) {
              const double lr = group.options().get_lr();
              next.lrs.push_back(hits == 0 ? lr : lr * std::pow(s.gamma, static_cast<double>(hits)));
            }
          },
          [&](const cosine_warmup_lr& s) {
            double factor = 0.0;
            if (epoch < s.warmup_steps) {
              factor = s.warmup_start_factor +
                       (1.0 - s.warmup_start_factor) * static_cast<double>(epoch) / static_cast<double>(s.warmup_steps);
            } else {
              const double progress = std::min(1.0, static_cast<double>(epoch - s.warmup_steps) /
                                                        static_cast<double>(s.total_steps - s.warmup_steps));
              factor = s.min_lr_factor + (1.0 - s.min_lr_factor) * 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
            }
            for (double base : base_lrs_) next.lrs.push_back(base * factor);
          },
          [&](const one_cycle_lr& s) {
            if (epoch > s.total_steps) {
              throw configuration_error("one_cycle_lr: tried to step " + std::to_string(epoch + 1) +
                                        " times; the schedule has total_steps=" + std::to_string(s.total_steps));
            }
            struct phase {
              double end_step;
              int start_lr, end_lr;  // 0 initial, 1 max, 2 min
              bool momentum_up;      // from base to max momentum (else max to base)
              bool momentum_flat;
            };
            const double total = static_cast<double>(s.total_steps);
            std::vector<phase> phases;
            if (s.three_phase) {
              phases = {{s.pct_start * total - 1, 0, 1, false, false},
                        {2 * s.pct_start * total - 2, 1, 0, true, false},
                        {total - 1, 0, 2, false, true}};
            } else {
              phases = {{s.pct_start * total - 1, 0, 1, false, false}, {total - 1, 1, 2, true, false}};
            }
            const double step_num = static_cast<double>(epoch);
            for (double initial : base_lrs_) {
              const double lrs[3] = {initial, s.max_lr, initial / s.final_div_factor};
              double start_step = 0;
              for (std::size_t i = 0; i < phases.size(); ++i) {
                const phase& p = phases[i];
                if (step_num <= p.end_step || i + 1 == phases.size()) {
                  const double pct = (step_num - start_step) / (p.end_step - start_step);
                  next.lrs.push_back(anneal(s.anneal_strategy, lrs[p.start_lr], lrs[p.end_lr], pct));
                  if (s.cycle_momentum) {
                    const double from = p.momentum_flat || !p.momentum_up ? s.max_momentum : s.base_momentum;
                    const double to = p.momentum_flat || p.momentum_up ? s.max_momentum : s.base_momentum;
                    next.momenta.push_back(anneal(s.anneal_strategy, from, to, pct));
                  }
                  break;
                }
                start_step = p.end_step;
              }
            }
          },
          [&](const lambda_lr& s) {
            for (double base : base_lrs_) next.lrs.push_back(base * s.factor(epoch));
          },
      },
      schedule_);
  return next;
}

void lr_scheduler::apply(const values& next) {
  auto& groups = optimizer_->param_groups();
  for (std::size_t i = 0; i < groups.size() && i < next.lrs.size(); ++i) {
    groups[i].options().set_lr(next.lrs[i]);
    if (i < next.momenta.size()) write_momentum(groups[i].options(), next.momenta[i]);
  }
  last_lr_ = next.lrs;
}

void lr_scheduler::step() {
  const values next = compute(last_epoch_ + 1);
  ++last_epoch_;
  apply(next);
}

std::string_view lr_scheduler::name() const noexcept {
  return std::visit(overloaded{[](const step_lr&) { return std::string_view("StepLR"); },
                               [](const multi_step_lr&) { return std::string_view("MultiStepLR"); },
                               [](const cosine_warmup_lr&) { return std::string_view("CosineWarmupLR"); },
                               [](const one_cycle_lr&) { return std::string_view("OneCycleLR"); },
                               [](const lambda_lr&) { return std::string_view("LambdaLR"); }},
                    schedule_);
}

namespace {
c10::List<double> to_list(const std::vector<double>& values) {
  c10::List<double> list;
  for (double v : values) list.push_back(v);
  return list;
}
// Checkpoints hold lists untyped (as Python does), so each item is read as a number.
std::vector<double> from_list(const c10::IValue& value) {
  std::vector<double> out;
  for (const c10::IValue& item : value.toListRef()) out.push_back(item.isInt() ? static_cast<double>(item.toInt()) : item.toDouble());
  return out;
}
}  // namespace

c10::IValue lr_scheduler::state_dict() const {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("schedule", std::string(name()));
  dict.insert("last_epoch", last_epoch_);
  dict.insert("base_lrs", to_list(base_lrs_));
  dict.insert("last_lr", to_list(last_lr_));
  return dict;
}

void lr_scheduler::load_state_dict(const c10::IValue& state) {
  const std::string where = "lr_scheduler (" + std::string(name()) + ")";
  if (!state.isGenericDict()) throw checkpoint_error(where + ": the saved state is not a dict");
  const auto dict = state.toGenericDict();
  for (const char* key : {"schedule", "last_epoch", "base_lrs", "last_lr"}) {
    if (!dict.contains(key)) throw checkpoint_error(where + ": the saved state has no '" + std::string(key) + "'");
  }
  const std::string saved = dict.at("schedule").toStringRef();
  if (saved != name()) {
    throw checkpoint_error(where + ": the checkpoint holds a " + saved + " schedule, not a " + std::string(name()));
  }
  std::vector<double> base = from_list(dict.at("base_lrs"));
  std::vector<double> last = from_list(dict.at("last_lr"));
  if (base.size() != optimizer_->param_groups().size() || last.size() != base.size()) {
    throw checkpoint_error(where + ": the checkpoint has " + std::to_string(base.size()) +
                           " parameter group(s), the optimizer has " +
                           std::to_string(optimizer_->param_groups().size()));
  }
  base_lrs_ = std::move(base);
  last_epoch_ = dict.at("last_epoch").toInt();
  values restored;
  restored.lrs = std::move(last);
  if (const auto* cycle = std::get_if<one_cycle_lr>(&schedule_); cycle && cycle->cycle_momentum) {
    restored.momenta = compute(last_epoch_).momenta;  // closed form: the momentum that step set
  }
  apply(restored);
}

std::vector<double> learning_rates(const torch::optim::Optimizer& optimizer) {
  std::vector<double> out;
  for (const auto& group : optimizer.param_groups()) out.push_back(group.options().get_lr());
  return out;
}

std::vector<double> momenta(const torch::optim::Optimizer& optimizer) {
  std::vector<double> out;
  for (const auto& group : optimizer.param_groups()) {
    auto& options = const_cast<torch::optim::OptimizerOptions&>(group.options());
    if (momentum_of(options) == momentum_kind::none) return {};
    out.push_back(read_momentum(options));
  }
  return out;
}

}  // namespace loom
