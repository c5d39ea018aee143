// One fit of loom::trainer: the epoch loop, gradient accumulation, the
// optimizer and scheduler steps, validation, logging, checkpoints and exact
// resume. Internal; loom::trainer::fit builds one per call.
#pragma once

#include <loom/callbacks/hooks.hpp>
#include <loom/trainer/hooks.hpp>
#include <loom/checkpoint/state.hpp>
#include <loom/concepts.hpp>
#include <loom/errors.hpp>
#include <loom/fabric_options.hpp>
#include <loom/trainer/checkpoint_files.hpp>
#include <loom/trainer/fit_context.hpp>
#include <loom/trainer/fit_progress.hpp>
#include <loom/trainer/optimization.hpp>
#include <loom/trainer/progress_bar.hpp>
#include <loom/trainer/step_output.hpp>
#include <loom/trainer/trainable.hpp>
#include <loom/trainer/trainer_options.hpp>
#include <loom/util/apply_to_collection.hpp>
#include <loom/util/random_state.hpp>
#include <loom/util/throughput.hpp>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace loom {

// What fit returns.
struct fit_result {
  std::int64_t epochs = 0;       // epochs finished
  std::int64_t global_step = 0;  // optimizer steps taken
  std::map<std::string, double> metrics;  // the latest value of each logged metric
  std::string last_checkpoint;   // the last checkpoint written or resumed from ("" if none)
  bool stopped_by_callback = false;
};

namespace detail {

// Runs body() with gradient synchronisation skipped when skip is true (all
// but the last micro-batch of an accumulation window). A strategy that
// cannot skip it either does not synchronise at all or always does; then the
// body simply runs.
// The same code for a static Fabric (may_skip_backward_sync and
// supports_no_backward_sync() are compile-time constants there) and for
// AnyFabric (the strategy answers at run time).
template <class F, class Model, class Body>
void with_sync_skipped(F& fabric, Model& model, bool skip, Body&& body) {
  if constexpr (F::may_skip_backward_sync) {
    if (fabric.supports_no_backward_sync()) {
      auto guard = fabric.no_backward_sync(model, skip);
      body();
      return;
    }
  }
  body();
}

// Lightning's _extract_batch_size: the first dimension of the batch's first tensor.
template <class Batch>
std::int64_t batch_size_of(Batch& batch) {
  std::int64_t size = -1;
  for_each_tensor(batch, [&size](const at::Tensor& t) {
    if (size < 0) size = t.dim() > 0 ? t.size(0) : 1;
  });
  return size < 0 ? 1 : size;
}

inline double scalar_of(const at::Tensor& value, const std::string& name) {
  if (value.numel() != 1) {
    throw configuration_error("trainer: the metric '" + name + "' must hold one element, it holds " +
                              std::to_string(value.numel()));
  }
  return value.item<double>();
}

// The named values of a step's output: the loss as loss_name, then the metrics.
inline std::vector<std::pair<std::string, at::Tensor>> named_values(const at::Tensor& output,
                                                                    const std::string& loss_name) {
  return {{loss_name, output}};
}
inline std::vector<std::pair<std::string, at::Tensor>> named_values(const step_output& output,
                                                                    const std::string& loss_name) {
  std::vector<std::pair<std::string, at::Tensor>> values;
  if (output.loss.defined()) values.emplace_back(loss_name, output.loss);
  for (const auto& metric : output.metrics) values.push_back(metric);
  return values;
}
inline const at::Tensor& loss_of(const at::Tensor& output) { return output; }
inline const at::Tensor& loss_of(const step_output& output) {
  if (!output.loss.defined()) throw configuration_error("trainer: training_step returned a step_output without a loss");
  return output.loss;
}

template <class FabricType, class Model, class Optimizer, class TrainLoader, class ValLoader>
class fit_loop {
 public:
  static constexpr bool has_validation = !std::is_same_v<ValLoader, std::nullptr_t>;

  fit_loop(FabricType& fabric, const trainer_options& options, fit_context& context, progress_bar& bar,
           Model& model, Optimizer& optimizer, lr_scheduler* scheduler, scheduler_interval interval,
           std::int64_t scheduler_frequency, TrainLoader& train, ValLoader* val)
      : fabric_(fabric),
        options_(options),
        context_(context),
        bar_(bar),
        model_(model),
        optimizer_(optimizer),
        scheduler_(scheduler),
        interval_(interval),
        scheduler_frequency_(scheduler_frequency),
        train_(train),
        val_(val),
        throughput_({.available_flops = options.available_flops,
                     .world_size = fabric.world_size(),
                     .window_size = options.throughput_window}) {}

  fit_result run(const std::string& resume) {
    fit_result result;
    if (!resume.empty()) result.last_checkpoint = restore(resume);
    sync_context();
    fabric_.template call<on_fit_start>(context_);
    fabric_.template call<on_train_start>();
    start_ = std::chrono::steady_clock::now();
    bool saved_here = !result.last_checkpoint.empty();
    while (!should_stop()) {
      const bool finished = train_epoch();
      saved_here = false;
      if (!finished) break;  // stopped inside the epoch (max_steps, a callback)
      const std::int64_t finished_epoch = progress_.epoch;
      if constexpr (has_validation) {
        if ((finished_epoch + 1) % options_.validation_frequency == 0) validate();
      }
      if (scheduler_ && interval_ == scheduler_interval::epoch && (finished_epoch + 1) % scheduler_frequency_ == 0) {
        scheduler_->step();
      }
      ++progress_.epoch;
      progress_.batch_in_epoch = 0;
      sync_context();
      if (options_.checkpoint_frequency > 0 && progress_.epoch % options_.checkpoint_frequency == 0) {
        result.last_checkpoint = save_checkpoint();
        saved_here = true;
      }
    }
    if (!saved_here) result.last_checkpoint = save_checkpoint();  // on stop
    fabric_.template call<on_train_end>();
    if (fabric_.is_global_zero()) {
      for (auto& sink : fabric_.loggers()) sink.finalize("success");
    }
    result.epochs = progress_.epoch;
    result.global_step = progress_.global_step;
    result.metrics = context_.metrics_;
    result.stopped_by_callback = context_.stop_requested_;
    return result;
  }

  // The trainer's full state, written by global rank zero (a collective).
  std::string save_checkpoint() {
    const std::string path = checkpoint_file_name(options_.checkpoint_dir, progress_.epoch, progress_.global_step);
    save_to(path);
    return path;
  }

  void save_to(const std::string& path) {
    // Every rank's generator state, so each resumes its own stream: always
    // [world_size, ...] in the file (all_gather adds no dimension on one process).
    at::Tensor random = fabric_.all_gather(capture_random_state());
    if (fabric_.world_size() == 1) random = random.unsqueeze(0);
    state checkpoint = core_state();
    checkpoint.set("rng", c10::IValue(random));
    c10::List<std::string> log_dirs;
    for (auto& sink : fabric_.loggers()) log_dirs.push_back(sink.log_dir());
    checkpoint.set("loggers", c10::IValue(log_dirs));
    fabric_.template call<on_save_checkpoint>(checkpoint);
    if (fabric_.is_global_zero()) {
      const auto parent = std::filesystem::path(path).parent_path();
      if (!parent.empty()) std::filesystem::create_directories(parent);
    }
    fabric_.save(path, checkpoint);
  }

 private:
  bool should_stop() const {
    if (context_.stop_requested_) return true;
    if (options_.max_steps && progress_.global_step >= *options_.max_steps) return true;
    return options_.max_epochs && progress_.epoch >= *options_.max_epochs;
  }

  void sync_context() {
    context_.epoch_ = progress_.epoch;
    context_.global_step_ = progress_.global_step;
    context_.batch_in_epoch_ = progress_.batch_in_epoch;
  }

  state core_state() {
    state checkpoint{{"model", model_}, {"optimizer", optimizer_}, {"loop", progress_}};
    if (scheduler_) checkpoint.set("scheduler", *scheduler_);
    return checkpoint;
  }

  // Restores a checkpoint in place; returns its path ("" when "last" found none).
  std::string restore(const std::string& resume) {
    std::string path = resume;
    if (resume == "last") {
      const auto latest = latest_checkpoint(options_.checkpoint_dir);
      if (!latest) {
        bar_.message("trainer: no checkpoint in " + options_.checkpoint_dir + " to resume from; starting afresh");
        return "";
      }
      path = *latest;
    }
    state checkpoint = core_state();
    fabric_.template call<on_load_checkpoint>(checkpoint);
    state rest = fabric_.load(path, checkpoint);
    if (rest.contains("rng")) {
      const at::Tensor random = rest.template get<at::Tensor>("rng");
      const std::int64_t rank = fabric_.global_rank();
      restore_random_state(random.size(0) > rank ? random[rank] : random[0]);
    }
    if (rest.contains("loggers")) {
      const auto dirs = rest.template get<c10::IValue>("loggers").toListRef();
      auto& sinks = fabric_.loggers();
      for (std::size_t i = 0; i < sinks.size() && i < dirs.size(); ++i) {
        const std::string& dir = dirs[i].toStringRef();
        if (!dir.empty() && fabric_.is_global_zero()) sinks[i].resume(dir, progress_.global_step);
      }
    }
    bar_.message("trainer: resumed from " + path + " at epoch " + std::to_string(progress_.epoch) + ", batch " +
                 std::to_string(progress_.batch_in_epoch) + ", step " + std::to_string(progress_.global_step));
    return path;
  }

  std::int64_t train_limit() const {
    std::int64_t batches = train_.size() ? static_cast<std::int64_t>(*train_.size()) : INT64_MAX;
    if (options_.limit_train_batches) batches = std::min(batches, *options_.limit_train_batches);
    return batches;
  }

  // One epoch from progress_.batch_in_epoch on. True when it ran to its end.
  bool train_epoch() {
    const std::int64_t limit = train_limit();
    const std::int64_t window = options_.grad_accum_steps;
    std::int64_t batch_idx = progress_.batch_in_epoch;
    fabric_.template call<on_train_epoch_start>(progress_.epoch);
    bar_.start_epoch(progress_.epoch, options_.max_epochs,
                     limit == INT64_MAX ? std::nullopt : std::optional<std::int64_t>(limit), batch_idx);
    if (limit == 0 && !options_.max_epochs) {
      throw configuration_error("trainer: the training loader gives no batch (limit_train_batches = 0 or an empty "
                                "dataset) and max_epochs is unset: fit would never end");
    }
    if (batch_idx >= limit) return finish_epoch(true);  // resumed where limit_train_batches now ends the epoch
    // The sampler's epoch is the fit's; a resumed epoch skips the batches it had done.
    train_.resume_at(progress_.epoch, static_cast<std::size_t>(batch_idx));
    bool stopped = false;
    for (auto& batch : train_) {
      fabric_.template call<on_train_batch_start>(batch_idx);
      const bool closes_window = (batch_idx + 1) % window == 0 || batch_idx + 1 == limit;
      at::Tensor loss;
      with_sync_skipped(fabric_, model_, !closes_window, [&] {
        auto output = model_.run(call_training_step{}, batch, batch_idx);
        loss = loss_of(output);
        last_output_ = named_values(output, "train_loss");
        for (auto& entry : last_output_) entry.second = entry.second.detach();
        const at::Tensor scaled = window > 1 ? loss / static_cast<double>(window) : loss;
        fabric_.template call<on_before_backward>(scaled);
        fabric_.backward(scaled);
      });
      const at::Tensor reported = loss.detach();
      fabric_.template call<on_train_batch_end>(reported, batch_idx);
      samples_ += batch_size_of(batch);
      ++batches_;
      ++batch_idx;
      progress_.batch_in_epoch = batch_idx;
      if (closes_window) optimizer_step();
      sync_context();
      if (bar_.due(batch_idx)) bar_.update(batch_idx, display_values());
      if (closes_window && should_stop()) {
        stopped = batch_idx < limit;
        break;
      }
      if (batch_idx >= limit) break;
    }
    return finish_epoch(!stopped);
  }

  bool finish_epoch(bool finished) {
    fabric_.template call<on_train_epoch_end>(progress_.epoch);
    bar_.end_epoch(progress_.batch_in_epoch, display_values());
    return finished;
  }

  void optimizer_step() {
    if (options_.gradient_clip_val) {
      clip_options clip;
      if (options_.gradient_clip_algorithm == clip_algorithm::norm) clip.max_norm = *options_.gradient_clip_val;
      else clip.clip_val = *options_.gradient_clip_val;
      fabric_.clip_gradients(model_, optimizer_, clip);
    }
    fabric_.template call<on_before_optimizer_step>(optimizer_.optimizer());
    optimizer_.step();
    fabric_.template call<on_before_zero_grad>(optimizer_.optimizer());
    optimizer_.zero_grad();
    ++progress_.global_step;
    if (scheduler_ && interval_ == scheduler_interval::step && progress_.global_step % scheduler_frequency_ == 0) {
      scheduler_->step();
    }
    if (options_.log_throughput) {
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
      throughput_.update(seconds, batches_, samples_, std::nullopt,
                         options_.flops_per_batch
                             ? std::optional<double>(*options_.flops_per_batch *
                                                     static_cast<double>(batches_ - batches_at_last_step_))
                             : std::nullopt);
      batches_at_last_step_ = batches_;
    }
    if (progress_.global_step % options_.log_every_n_steps == 0) log_training();
  }

  void log_training() {
    metrics values;
    for (const auto& [name, tensor] : last_output_) {
      const double value = scalar_of(tensor, name);
      context_.metrics_[name] = value;
      values.emplace_back(name, value);
    }
    values.emplace_back("epoch", progress_.epoch);
    if (options_.log_throughput) {
      for (auto& entry : throughput_.compute()) {
        if (entry.first.find("per_sec") != std::string::npos || entry.first.find("mfu") != std::string::npos) {
          values.push_back(std::move(entry));
        }
      }
    }
    fabric_.log_dict(values, progress_.global_step);
  }

  // The bar shows the last step's values and the last validation's.
  std::vector<std::pair<std::string, double>> display_values() {
    std::vector<std::pair<std::string, double>> values;
    if (!bar_.active()) return values;  // reading values syncs with the device: only for a bar that draws
    for (const auto& [name, tensor] : last_output_) {
      if (tensor.numel() == 1) values.emplace_back(name == "train_loss" ? "loss" : name, tensor.item().toDouble());
    }
    for (const auto& name : validation_names_) {
      if (auto value = context_.metric(name)) values.emplace_back(name, *value);
    }
    return values;
  }

  void validate() {
    if constexpr (has_validation) {
      fabric_.template call<on_validation_start>();
      std::int64_t limit = val_->size() ? static_cast<std::int64_t>(*val_->size()) : INT64_MAX;
      if (options_.limit_val_batches) limit = std::min(limit, *options_.limit_val_batches);
      // Weighted sums (by batch size) and weights, as doubles on the device.
      std::vector<std::string> names;
      std::vector<at::Tensor> sums;
      double weight = 0;
      {
        at::NoGradGuard no_grad;
        model_->eval();
        std::int64_t batch_idx = 0;
        if (limit > 0) {
          for (auto& batch : *val_) {
            auto output = model_.run(call_validation_step{}, batch, batch_idx);
            const auto values = named_values(output, "val_loss");
            const double size = static_cast<double>(batch_size_of(batch));
            if (names.empty()) {
              for (const auto& entry : values) {
                names.push_back(entry.first);
                sums.push_back(at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(fabric_.device())));
              }
            }
            if (values.size() != names.size()) {
              throw configuration_error("trainer: validation_step must return the same metrics for every batch");
            }
            for (std::size_t i = 0; i < values.size(); ++i) {
              if (values[i].second.numel() != 1) scalar_of(values[i].second, values[i].first);  // throws
              sums[i] += values[i].second.detach().to(at::kDouble).reshape({}) * size;
            }
            weight += size;
            fabric_.template call<on_validation_batch_end>(values.empty() ? at::Tensor() : values.front().second,
                                                           batch_idx);
            if (++batch_idx >= limit) break;
          }
        }
        model_->train();
      }
      // One all-reduce for every metric and the weight (ranks see the same names).
      std::vector<at::Tensor> parts = sums;
      parts.push_back(at::full({}, weight, at::TensorOptions().dtype(at::kDouble).device(fabric_.device())));
      const at::Tensor totals = fabric_.all_reduce(at::stack(parts), reduce_op::sum).to(at::kCPU);
      const double total_weight = totals[static_cast<std::int64_t>(names.size())].template item<double>();
      metrics logged;
      std::string line = "validation after epoch " + std::to_string(progress_.epoch + 1) + ":";
      for (std::size_t i = 0; i < names.size(); ++i) {
        const double mean = total_weight > 0 ? totals[static_cast<std::int64_t>(i)].template item<double>() / total_weight
                                             : std::numeric_limits<double>::quiet_NaN();
        context_.metrics_[names[i]] = mean;
        logged.emplace_back(names[i], mean);
        char buffer[64];
        std::snprintf(buffer, sizeof(buffer), " %s=%.4f", names[i].c_str(), mean);
        line += buffer;
      }
      validation_names_ = names;
      logged.emplace_back("epoch", progress_.epoch);
      fabric_.log_dict(logged, progress_.global_step);
      bar_.message(line);
      sync_context();
      fabric_.template call<on_validation_end>();
    }
  }

  FabricType& fabric_;
  const trainer_options& options_;
  fit_context& context_;
  progress_bar& bar_;
  Model& model_;
  Optimizer& optimizer_;
  lr_scheduler* scheduler_;
  scheduler_interval interval_;
  std::int64_t scheduler_frequency_;
  TrainLoader& train_;
  ValLoader* val_;
  fit_progress progress_;
  throughput throughput_;
  std::chrono::steady_clock::time_point start_;
  std::int64_t batches_ = 0;
  std::int64_t samples_ = 0;
  std::int64_t batches_at_last_step_ = 0;
  std::vector<std::pair<std::string, at::Tensor>> last_output_;
  std::vector<std::string> validation_names_;
};

}  // namespace detail
}  // namespace loom
