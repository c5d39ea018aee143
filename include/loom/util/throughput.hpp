// Lightning's Throughput and ThroughputMonitor: rolling batches/s, samples/s,
// items/s, flops/s and MFU from monotonically increasing counters that the
// caller passes with its own clock (so a test can pass a fixed one).
//
// Keys (Lightning's): time, batches, samples, lengths; once the window is full
// device/batches_per_sec, device/samples_per_sec, device/items_per_sec,
// device/flops_per_sec, device/mfu, and with world_size > 1 the global
// batches_per_sec, samples_per_sec, items_per_sec, flops_per_sec (device
// value x world size). Two deliberate differences from Lightning 2.x:
// items/s is elapsed items over elapsed time (Lightning multiplies samples/s
// by items per batch), and flops/s counts the flops of the batches inside the
// window once each (Lightning's sum(window) - window[0]).
#pragma once

#include <loom/loggers/logger.hpp>

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

namespace loom {

struct throughput_options {
  std::optional<double> available_flops;  // one device's peak, for MFU
  int world_size = 1;
  std::int64_t window_size = 100;  // updates in the rolling window (at least 2)
  std::string separator = "/";
};

class throughput {
 public:
  explicit throughput(throughput_options options = {});

  // Totals so far, per device: elapsed seconds, batches, samples, optionally
  // items (e.g. tokens) and the flops of this update's batch. Each must not
  // decrease (time must increase), else std::invalid_argument.
  void update(double time, std::int64_t batches, std::int64_t samples, std::optional<std::int64_t> lengths = {},
              std::optional<double> flops_per_batch = {});
  metrics compute() const;
  void reset();
  const throughput_options& options() const noexcept { return options_; }

 private:
  throughput_options options_;
  std::deque<double> time_;
  std::deque<std::int64_t> batches_;
  std::deque<std::int64_t> samples_;
  std::deque<std::int64_t> lengths_;
  std::deque<double> flops_;
};

// Lightning's ThroughputMonitor: a throughput whose compute_and_log sends the
// metrics to a Fabric's loggers (global rank zero), with a step that counts
// calls unless one is given.
template <class FabricType>
class throughput_monitor : public throughput {
 public:
  throughput_monitor(FabricType& fabric, throughput_options options = {})
      : throughput(with_world(fabric, std::move(options))), fabric_(&fabric) {}

  metrics compute_and_log(std::optional<std::int64_t> step = std::nullopt) {
    step_ = step ? *step : step_ + 1;
    metrics values = compute();
    fabric_->log_dict(values, step_);
    return values;
  }

 private:
  static throughput_options with_world(FabricType& fabric, throughput_options options) {
    options.world_size = fabric.world_size();
    return options;
  }
  FabricType* fabric_;
  std::int64_t step_ = -1;
};

}  // namespace loom
