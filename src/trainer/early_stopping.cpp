#include <loom/checkpoint/state.hpp>
#include <loom/errors.hpp>
#include <loom/trainer/callbacks/early_stopping.hpp>

#include <cmath>
#include <cstdio>
#include <limits>

namespace loom {

early_stopping::early_stopping(early_stopping_options options) : options_(std::move(options)) {
  if (options_.patience < 0) throw configuration_error("early_stopping: patience must be >= 0");
  if (options_.min_delta < 0) throw configuration_error("early_stopping: min_delta must be >= 0");
  best_score_ = options_.mode == monitor_mode::min ? std::numeric_limits<double>::infinity()
                                                   : -std::numeric_limits<double>::infinity();
}

bool early_stopping::improves(double current, double reference) const {
  return options_.mode == monitor_mode::min ? current < reference : current > reference;
}

bool early_stopping::should_stop(double current) {
  char buffer[256];
  if (options_.check_finite && !std::isfinite(current)) {
    std::snprintf(buffer, sizeof(buffer), "Monitored metric %s = %g is not finite. Previous best value was %.3f.",
                  options_.monitor.c_str(), current, best_score_);
    reason_ = buffer;
    return true;
  }
  if (options_.stopping_threshold && improves(current, *options_.stopping_threshold)) {
    std::snprintf(buffer, sizeof(buffer), "Stopping threshold reached: %s = %g %s %g.", options_.monitor.c_str(),
                  current, options_.mode == monitor_mode::min ? "<" : ">", *options_.stopping_threshold);
    reason_ = buffer;
    return true;
  }
  if (options_.divergence_threshold && improves(-current, -*options_.divergence_threshold)) {
    std::snprintf(buffer, sizeof(buffer), "Divergence threshold reached: %s = %g %s %g.", options_.monitor.c_str(),
                  current, options_.mode == monitor_mode::min ? ">" : "<", *options_.divergence_threshold);
    reason_ = buffer;
    return true;
  }
  // Lightning: improvement means beating the best by more than min_delta.
  const double shifted = options_.mode == monitor_mode::min ? current + options_.min_delta : current - options_.min_delta;
  if (improves(shifted, best_score_)) {
    best_score_ = current;
    wait_count_ = 0;
    return false;
  }
  ++wait_count_;
  if (wait_count_ >= options_.patience) {
    std::snprintf(buffer, sizeof(buffer),
                  "Monitored metric %s did not improve in the last %lld records. Best score: %.3f.",
                  options_.monitor.c_str(), static_cast<long long>(wait_count_), best_score_);
    reason_ = buffer;
    return true;
  }
  return false;
}

void early_stopping::on_validation_end() {
  if (fit_ == nullptr) return;  // used outside loom::trainer
  const auto current = fit_->metric(options_.monitor);
  if (!current) {
    std::string known;
    for (const auto& [name, value] : fit_->metrics()) known += (known.empty() ? "" : ", ") + name;
    const std::string message = "early_stopping: the monitored metric '" + options_.monitor +
                                "' was not logged; available: " + (known.empty() ? "none" : known);
    if (options_.strict) throw configuration_error(message);
    if (!warned_missing_ && fit_->is_global_zero()) std::fprintf(stderr, "%s\n", message.c_str());
    warned_missing_ = true;
    return;
  }
  if (should_stop(*current)) {
    stopped_epoch_ = fit_->epoch();
    fit_->request_stop();
    if (options_.verbose && fit_->is_global_zero()) std::fprintf(stderr, "early_stopping: %s\n", reason_.c_str());
  }
}

c10::IValue early_stopping::state_dict() const {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  dict.insert("wait_count", wait_count_);
  dict.insert("stopped_epoch", stopped_epoch_);
  dict.insert("best_score", best_score_);
  dict.insert("patience", options_.patience);
  return dict;
}

void early_stopping::load_state_dict(const c10::IValue& value) {
  if (!value.isGenericDict()) throw checkpoint_error("early_stopping: the saved state is not a dict");
  const auto dict = value.toGenericDict();
  for (const char* key : {"wait_count", "stopped_epoch", "best_score"}) {
    if (!dict.contains(key)) throw checkpoint_error(std::string("early_stopping: the saved state has no '") + key + "'");
  }
  wait_count_ = dict.at("wait_count").toInt();
  stopped_epoch_ = dict.at("stopped_epoch").toInt();
  best_score_ = dict.at("best_score").toDouble();
}

void early_stopping::on_save_checkpoint(state& checkpoint) { checkpoint.add(state_entry(state_key(), *this)); }
void early_stopping::on_load_checkpoint(state& checkpoint) {
  // Optional: a checkpoint from a run without this callback still loads.
  state_entry entry(state_key(), *this);
  checkpoint.add(std::move(entry.optional()));
}

}  // namespace loom
