#include <loom/trainer/callbacks/lr_monitor.hpp>
#include <loom/trainer/lr_scheduler.hpp>

#include <cxxabi.h>
#include <torch/optim/optimizer.h>

#include <cstdlib>
#include <memory>
#include <typeinfo>

namespace loom {

namespace {
// "torch::optim::Adam" -> "Adam", as Lightning names the logged key.
std::string optimizer_name(const torch::optim::Optimizer& optimizer) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> demangled(
      abi::__cxa_demangle(typeid(optimizer).name(), nullptr, nullptr, &status), std::free);
  std::string name = status == 0 && demangled ? demangled.get() : typeid(optimizer).name();
  const auto colon = name.rfind("::");
  return colon == std::string::npos ? name : name.substr(colon + 2);
}
}  // namespace

metrics lr_monitor::current() const {
  metrics values;
  if (fit_ == nullptr) return values;
  const torch::optim::Optimizer& optimizer = fit_->optimizer();
  const std::string base = "lr-" + optimizer_name(optimizer);
  const auto lrs = learning_rates(optimizer);
  const auto moms = options_.log_momentum ? momenta(optimizer) : std::vector<double>{};
  for (std::size_t i = 0; i < lrs.size(); ++i) {
    const std::string suffix = i == 0 ? "" : "/pg" + std::to_string(i + 1);
    values.emplace_back(base + suffix, lrs[i]);
    if (i < moms.size()) values.emplace_back(base + "-momentum" + suffix, moms[i]);
  }
  return values;
}

void lr_monitor::on_before_optimizer_step(torch::optim::Optimizer& /*optimizer*/) {
  // The lr this step uses, logged under the step it produces, at the
  // trainer's logging cadence (as Lightning's monitor follows log_every_n_steps).
  if (fit_ == nullptr || options_.interval != logging_interval::step) return;
  const std::int64_t step = fit_->global_step() + 1;
  if (step % fit_->log_every_n_steps() == 0) fit_->log(current(), step);
}

void lr_monitor::on_train_epoch_start(std::int64_t /*epoch*/) {
  if (fit_ != nullptr && options_.interval == logging_interval::epoch) fit_->log(current());
}

}  // namespace loom
