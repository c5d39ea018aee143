#include <loom/util/throughput.hpp>

#include <stdexcept>
#include <string>

namespace loom {

throughput::throughput(throughput_options options) : options_(std::move(options)) {
  if (options_.world_size < 1) throw std::invalid_argument("throughput: world_size must be positive");
  if (options_.window_size < 2) {
    throw std::invalid_argument("throughput: window_size must be at least 2 (rates need two points)");
  }
}

namespace {
template <class T>
void push(std::deque<T>& window, T value, std::int64_t capacity, const char* name, bool strictly) {
  if (!window.empty() && (strictly ? !(value > window.back()) : value < window.back())) {
    throw std::invalid_argument(std::string("throughput.update: ") + name + " must " +
                                (strictly ? "increase" : "not decrease") + " with each call (got " +
                                std::to_string(value) + " after " + std::to_string(window.back()) + ")");
  }
  window.push_back(value);
  if (static_cast<std::int64_t>(window.size()) > capacity) window.pop_front();
}
}  // namespace

void throughput::update(double time, std::int64_t batches, std::int64_t samples, std::optional<std::int64_t> lengths,
                        std::optional<double> flops_per_batch) {
  push(time_, time, options_.window_size, "time", true);
  push(batches_, batches, options_.window_size, "batches", false);
  push(samples_, samples, options_.window_size, "samples", false);
  if (lengths) {
    push(lengths_, *lengths, options_.window_size, "lengths", false);
    if (lengths_.size() != samples_.size()) {
      throw std::invalid_argument("throughput.update: pass lengths with every update or with none");
    }
  }
  if (flops_per_batch) {
    flops_.push_back(*flops_per_batch);
    if (static_cast<std::int64_t>(flops_.size()) > options_.window_size) flops_.pop_front();
  }
}

metrics throughput::compute() const {
  metrics out;
  if (time_.empty()) return out;
  const std::string device = "device" + options_.separator;
  const double world = options_.world_size;
  const bool global = options_.world_size > 1;
  out.emplace_back("time", time_.back());
  out.emplace_back("batches", batches_.back());
  out.emplace_back("samples", samples_.back());
  if (!lengths_.empty()) out.emplace_back("lengths", lengths_.back());
  const auto window = static_cast<std::size_t>(options_.window_size);
  if (time_.size() < window) return out;
  const double elapsed = time_.back() - time_.front();
  const double batches_per_sec = static_cast<double>(batches_.back() - batches_.front()) / elapsed;
  const double samples_per_sec = static_cast<double>(samples_.back() - samples_.front()) / elapsed;
  out.emplace_back(device + "batches_per_sec", batches_per_sec);
  out.emplace_back(device + "samples_per_sec", samples_per_sec);
  if (global) {
    out.emplace_back("batches_per_sec", batches_per_sec * world);
    out.emplace_back("samples_per_sec", samples_per_sec * world);
  }
  if (lengths_.size() == window) {
    const double items_per_sec = static_cast<double>(lengths_.back() - lengths_.front()) / elapsed;
    out.emplace_back(device + "items_per_sec", items_per_sec);
    if (global) out.emplace_back("items_per_sec", items_per_sec * world);
  }
  if (flops_.size() == window) {
    // The first entry's batch ended at time_.front(), before the window began.
    double flops = 0;
    for (std::size_t i = 1; i < flops_.size(); ++i) flops += flops_[i];
    const double flops_per_sec = flops / elapsed;
    out.emplace_back(device + "flops_per_sec", flops_per_sec);
    if (global) out.emplace_back("flops_per_sec", flops_per_sec * world);
    if (options_.available_flops && *options_.available_flops > 0) {
      out.emplace_back(device + "mfu", flops_per_sec / *options_.available_flops);
    }
  }
  return out;
}

void throughput::reset() {
  time_.clear();
  batches_.clear();
  samples_.clear();
  lengths_.clear();
  flops_.clear();
}

}  // namespace loom
