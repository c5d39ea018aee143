#include <loom/checkpoint/state.hpp>
#include <loom/errors.hpp>
#include <loom/trainer/callbacks/model_checkpoint.hpp>

#include <cstdio>
#include <filesystem>
#include <system_error>

namespace loom {

model_checkpoint::model_checkpoint(model_checkpoint_options options) : options_(std::move(options)) {
  if (options_.save_top_k < -1) throw configuration_error("model_checkpoint: save_top_k must be >= -1");
  if (options_.every_n_epochs < 1) throw configuration_error("model_checkpoint: every_n_epochs must be >= 1");
}

void model_checkpoint::on_fit_start(fit_context& fit) {
  fit_ = &fit;
  dirpath_ = options_.dirpath.empty() ? (std::filesystem::path(fit.checkpoint_dir()) / "best").string()
                                      : options_.dirpath;
}

bool model_checkpoint::better(double a, double b) const {
  return options_.mode == monitor_mode::min ? a < b : a > b;
}

void model_checkpoint::on_validation_end() {
  if (fit_ == nullptr || !options_.monitor) return;
  if ((fit_->epoch() + 1) % options_.every_n_epochs != 0) return;
  const auto value = fit_->metric(*options_.monitor);
  if (!value) {
    std::string known;
    for (const auto& [name, v] : fit_->metrics()) known += (known.empty() ? "" : ", ") + name;
    throw configuration_error("model_checkpoint: the monitored metric '" + *options_.monitor +
                              "' was not logged; available: " + (known.empty() ? "none" : known));
  }
  save(*value, true);
}

void model_checkpoint::on_train_epoch_end(std::int64_t epoch) {
  // Without a monitored metric: the newest checkpoints, after whole epochs.
  if (fit_ == nullptr || options_.monitor || (epoch + 1) % options_.every_n_epochs != 0) return;
  save(static_cast<double>(fit_->global_step()), false);
}

void model_checkpoint::save(double score, bool has_metric) {
  if (fit_->global_step() == last_saved_step_) return;  // nothing new since the last save
  last_saved_step_ = fit_->global_step();
  namespace fs = std::filesystem;
  const auto k = options_.save_top_k;
  const bool keep_all = k == -1;
  // Without a monitor the newest win (score = step, "max").
  auto is_better = [&](double a, double b) { return has_metric ? better(a, b) : a > b; };
  std::string worst;
  for (const auto& [path, kept] : best_k_models_) {
    if (worst.empty() || is_better(best_k_models_.at(worst), kept)) worst = path;
  }
  const bool enters_top_k =
      keep_all || (k > 0 && (static_cast<std::int64_t>(best_k_models_.size()) < k ||
                             is_better(score, best_k_models_.at(worst))));
  std::string name = "epoch=" + std::to_string(fit_->epoch()) + "-step=" + std::to_string(fit_->global_step());
  if (has_metric) {
    char buffer[64];
    std::snprintf(buffer, sizeof(buffer), "-%s=%.4f", options_.monitor->c_str(), score);
    name += buffer;
  }
  const std::string path = (fs::path(dirpath_) / (name + ".ckpt")).string();
  if (enters_top_k) {
    fit_->save_checkpoint(path);
    best_k_models_[path] = score;
    if (!keep_all && static_cast<std::int64_t>(best_k_models_.size()) > k) {
      best_k_models_.erase(worst);
      std::error_code ec;
      // remove_all: a sharded checkpoint is a directory.
      if (fit_->is_global_zero() && worst != path) fs::remove_all(worst, ec);
    }
    best_model_path_.clear();
    for (const auto& [kept_path, kept] : best_k_models_) {
      if (best_model_path_.empty() || is_better(kept, best_k_models_.at(best_model_path_))) best_model_path_ = kept_path;
    }
    if (has_metric) best_model_score_ = best_k_models_.at(best_model_path_);
  }
  if (options_.save_last) {
    last_model_path_ = (fs::path(dirpath_) / "last.ckpt").string();
    fit_->save_checkpoint(last_model_path_);
  }
}

c10::IValue model_checkpoint::state_dict() const {
  c10::impl::GenericDict dict(c10::StringType::get(), c10::AnyType::get());
  c10::impl::GenericDict kept(c10::StringType::get(), c10::FloatType::get());
  for (const auto& [path, score] : best_k_models_) kept.insert(path, score);
  dict.insert("best_k_models", kept);
  dict.insert("best_model_path", best_model_path_);
  dict.insert("best_model_score", best_model_score_ ? c10::IValue(*best_model_score_) : c10::IValue());
  dict.insert("last_model_path", last_model_path_);
  dict.insert("dirpath", dirpath_);
  return dict;
}

void model_checkpoint::load_state_dict(const c10::IValue& value) {
  if (!value.isGenericDict()) throw checkpoint_error("model_checkpoint: the saved state is not a dict");
  const auto dict = value.toGenericDict();
  for (const char* key : {"best_k_models", "best_model_path", "best_model_score", "last_model_path"}) {
    if (!dict.contains(key)) throw checkpoint_error(std::string("model_checkpoint: the saved state has no '") + key + "'");
  }
  best_k_models_.clear();
  for (const auto& item : dict.at("best_k_models").toGenericDict()) {
    best_k_models_[item.key().toStringRef()] = item.value().toDouble();
  }
  best_model_path_ = dict.at("best_model_path").toStringRef();
  const auto score = dict.at("best_model_score");
  best_model_score_ = score.isNone() ? std::nullopt : std::optional<double>(score.toDouble());
  last_model_path_ = dict.at("last_model_path").toStringRef();
}

namespace {
std::string key_of(const model_checkpoint_options& options) {
  return "callbacks/model_checkpoint/" + options.monitor.value_or("latest");
}
}  // namespace

void model_checkpoint::on_save_checkpoint(state& checkpoint) { checkpoint.add(state_entry(key_of(options_), *this)); }
void model_checkpoint::on_load_checkpoint(state& checkpoint) {
  state_entry entry(key_of(options_), *this);
  checkpoint.add(std::move(entry.optional()));
}

}  // namespace loom
