// The NVMe optimizer stream (nvme_stream.hpp) over io_uring. The state file
// holds, per sub-group, exp_avg then exp_avg_sq (fp32), padded to the file
// system's block alignment; each buffer holds one sub-group's state. With
// offload_param, each sub-group's region starts with its parameters (padded
// to the alignment too), so one request per sub-group reads both. Per
// step, with B buffers and G sub-groups:
//   reads of sub-groups 0 .. B-2 are issued first (none on the first step:
//   Adam's state starts at zero);
//   for each g: wait for g's read; update g; issue g's write; wait for the
//   write of g-1 (whose buffer is the one the read of g+B-1 needs) and issue
//   that read;
//   at the end, wait for the writes left.
// Each transfer is cut into block_size requests, at most queue_depth in flight.
// A completion thread reaps the ring as requests finish, so the busy time of
// each direction (the time with at least one request in flight) ends when
// the last one completes, not when the stepping thread next looks.
#include <loom/errors.hpp>
#include <loom/strategy/nvme_stream.hpp>
#include <loom/util/offload_io.hpp>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>

#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <deque>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <thread>

namespace loom::detail {

namespace {

constexpr std::int64_t alignment = 4096;  // covers the logical block size of common file systems
std::int64_t align_up(std::int64_t v) { return (v + alignment - 1) / alignment * alignment; }

using clock_type = std::chrono::steady_clock;

std::uint64_t nanoseconds_between(clock_type::time_point from, clock_type::time_point to) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(to - from).count());
}

// loom::offload_io_so_far's tally: every stream of the process adds to it.
struct io_tally {
  std::atomic<std::uint64_t> bytes_read{0}, bytes_written{0}, read_busy_ns{0}, write_busy_ns{0};
};
io_tally& process_io() {
  static io_tally tally;
  return tally;
}

}  // namespace

struct sub_group {
  at::Tensor param, grad;  // 1-D views of one segment
  std::size_t segment = 0;
  std::int64_t begin = 0;  // in the segment
  std::int64_t numel = 0;
  std::int64_t file_offset = 0;  // the region: parameters (offload_param), then exp_avg and exp_avg_sq
  std::int64_t param_bytes = 0;  // the parameters' part of the region (0 without offload_param)
  std::int64_t state_offset() const { return file_offset + param_bytes; }
  std::int64_t region_bytes() const { return param_bytes + align_up(2 * numel * 4); }
};

struct request {
  int buffer = 0;
  bool write = false;
};

struct nvme_stream::impl {
  nvme_stream_options options;
  std::vector<sub_group> groups;
  std::string path;
  int fd = -1;
  io_uring ring{};
  bool ring_ready = false;
  std::int64_t slot_bytes = 0;        // one sub-group's state, aligned
  std::vector<c10::DataPtr> storage;  // through the CPU allocator (counted), over-allocated for alignment
  std::vector<char*> aligned;
  std::vector<at::Tensor> views;      // float over each aligned buffer
  std::vector<int> pending;           // per buffer: requests in flight
  std::vector<int> queued_of;         // per buffer: requests not yet submitted
  struct job {
    int buffer;
    bool write;
    std::int64_t offset;  // in the file
    std::int64_t begin, end;  // in the buffer
  };
  std::deque<job> queue;  // cut into block_size pieces, waiting for a slot in the ring
  int in_flight = 0;
  int reads_in_flight = 0, writes_in_flight = 0;
  clock_type::time_point read_since, write_since;
  std::int64_t step = 0;
  std::vector<std::int64_t> segment_numel;
  nvme_counters counters;
  // The completion thread and what it shares with the stepping thread
  // (pending, in_flight, the counters, error).
  std::mutex mutex;
  std::condition_variable done;
  std::thread reaper;
  bool stopping = false;
  std::string error;

  [[noreturn]] void fail(const std::string& what, int error) const {
    throw std::runtime_error("deepspeed nvme offload: " + what + " on " + path + ": " + std::strerror(error));
  }

  // Moves queued pieces into the ring while it has room (caller holds mutex).
  void pump() {
    int added = 0;
    while (!queue.empty() && in_flight < options.queue_depth) {
      const job j = queue.front();
      io_uring_sqe* sqe = io_uring_get_sqe(&ring);
      if (sqe == nullptr) break;
      queue.pop_front();
      char* base = aligned[static_cast<std::size_t>(j.buffer)] + j.begin;
      const auto length = static_cast<unsigned>(j.end - j.begin);
      if (j.write) io_uring_prep_write(sqe, fd, base, length, static_cast<__u64>(j.offset));
      else io_uring_prep_read(sqe, fd, base, length, static_cast<__u64>(j.offset));
      io_uring_sqe_set_data64(sqe, static_cast<__u64>(j.buffer) * 2 + (j.write ? 1 : 0) +
                                       (static_cast<__u64>(length) << 32));
      ++in_flight;
      const auto now = clock_type::now();
      if (j.write) {
        if (writes_in_flight++ == 0) write_since = now;
      } else {
        if (reads_in_flight++ == 0) read_since = now;
      }
      ++added;
    }
    if (added > 0) {
      const int submitted = io_uring_submit(&ring);
      if (submitted < 0) fail("io_uring_submit", -submitted);
    }
  }
  void transfer(int buffer, bool write, std::int64_t offset, std::int64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    for (std::int64_t begin = 0; begin < bytes; begin += options.block_size) {
      queue.push_back({buffer, write, offset + begin, begin, std::min(bytes, begin + options.block_size)});
      ++pending[static_cast<std::size_t>(buffer)];
    }
    pump();
  }
  // The completion thread: each completion timestamped as it arrives.
  void reap() {
    for (;;) {
      io_uring_cqe* cqe = nullptr;
      const int status = io_uring_wait_cqe(&ring, &cqe);
      std::lock_guard<std::mutex> lock(mutex);
      if (status < 0) {
        if (status == -EINTR) continue;
        error = std::string("io_uring_wait_cqe: ") + std::strerror(-status);
        done.notify_all();
        return;
      }
      const __u64 data = io_uring_cqe_get_data64(cqe);
      const int result = cqe->res;
      io_uring_cqe_seen(&ring, cqe);
      if (data == ~0ULL) return;  // the stop request
      const int done_buffer = static_cast<int>((data & 0xffffffffULL) / 2);
      const bool write = (data & 1ULL) != 0;
      const auto length = static_cast<std::int64_t>(data >> 32);
      if (result < 0 && error.empty()) error = std::string(write ? "a write" : "a read") + ": " + std::strerror(-result);
      if (result >= 0 && result != length && error.empty()) {
        error = std::string("a ") + (write ? "write" : "read") + " of " + std::to_string(length) + " bytes moved " +
                std::to_string(result);
      }
      --in_flight;
      --pending[static_cast<std::size_t>(done_buffer)];
      const auto now = clock_type::now();
      const auto moved = static_cast<std::uint64_t>(std::max(result, 0));
      io_tally& tally = process_io();
      if (write) {
        counters.bytes_written += moved;
        tally.bytes_written.fetch_add(moved, std::memory_order_relaxed);
        if (--writes_in_flight == 0) {
          const std::uint64_t busy = nanoseconds_between(write_since, now);
          counters.write_busy_seconds += static_cast<double>(busy) / 1e9;
          tally.write_busy_ns.fetch_add(busy, std::memory_order_relaxed);
        }
      } else {
        counters.bytes_read += moved;
        tally.bytes_read.fetch_add(moved, std::memory_order_relaxed);
        if (--reads_in_flight == 0) {
          const std::uint64_t busy = nanoseconds_between(read_since, now);
          counters.read_busy_seconds += static_cast<double>(busy) / 1e9;
          tally.read_busy_ns.fetch_add(busy, std::memory_order_relaxed);
        }
      }
      try {
        pump();
      } catch (const std::exception& e) {
        if (error.empty()) error = e.what();
      }
      done.notify_all();
    }
  }
  // Until buffer has nothing in flight.
  void wait(int buffer) {
    std::unique_lock<std::mutex> lock(mutex);
    done.wait(lock, [&] { return pending[static_cast<std::size_t>(buffer)] == 0 || !error.empty(); });
    if (!error.empty()) throw std::runtime_error("deepspeed nvme offload: " + error + " on " + path);
  }
};

void nvme_stream::check_directory(const std::string& directory) {
  std::error_code ec;
  if (directory.empty() || !std::filesystem::is_directory(directory, ec)) {
    throw configuration_error("deepspeed: nvme_path '" + directory + "' is not an existing directory; NVMe offload "
                              "streams the optimizer state through files there: create it on a local disk");
  }
  const std::string probe = directory + "/.loom-nvme-probe-" + std::to_string(::getpid());
  const int fd = ::open(probe.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    throw configuration_error("deepspeed: nvme_path '" + directory + "' cannot hold the offloaded state: opening a "
                              "file there with O_DIRECT failed (" + std::strerror(error) + "); it must be a writable "
                              "directory on a file system with direct I/O (not tmpfs)");
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

nvme_stream::nvme_stream(const nvme_stream_options& options, std::vector<at::Tensor> parameters,
                         std::vector<at::Tensor> gradients)
    : impl_(std::make_unique<impl>()) {
  impl& self = *impl_;
  self.options = options;
  self.options.buffer_count = std::max(1, options.buffer_count);
  self.options.queue_depth = std::max(1, options.queue_depth);
  self.options.block_size = std::max<std::int64_t>(alignment, options.block_size / alignment * alignment);
  check_directory(options.directory);
  // Sub-groups: each segment cut into pieces of sub_group_size elements.
  std::int64_t largest = 0;  // bytes of the largest region
  std::int64_t offset = 0;
  for (std::size_t s = 0; s < parameters.size(); ++s) {
    const at::Tensor& p = parameters[s];
    if (p.scalar_type() != at::kFloat && !options.masters) {
      throw configuration_error("deepspeed: NVMe offload streams fp32 state of fp32 partitions; this one is " +
                                std::string(c10::toString(p.scalar_type())));
    }
    for (std::int64_t begin = 0; begin < p.numel(); begin += options.sub_group_size) {
      const std::int64_t n = std::min(options.sub_group_size, p.numel() - begin);
      sub_group g;
      g.param = p.narrow(0, begin, n);
      g.grad = gradients[s].narrow(0, begin, n);
      g.segment = s;
      g.begin = begin;
      g.numel = n;
      g.file_offset = offset;
      g.param_bytes = options.parameters || options.masters ? align_up(n * 4) : 0;
      offset += g.region_bytes();
      largest = std::max(largest, g.region_bytes());
      self.groups.push_back(g);
    }
  }
  self.segment_numel.reserve(parameters.size());
  for (const auto& p : parameters) self.segment_numel.push_back(p.numel());
  self.slot_bytes = largest;
  self.counters.sub_groups = self.groups.size();
  self.counters.state_bytes_per_sub_group = self.slot_bytes;
  self.path = options.directory + "/loom_zero_optim_rank" + std::to_string(options.rank) + "_" +
              std::to_string(::getpid()) + ".swp";
  self.fd = ::open(self.path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (self.fd < 0) self.fail("open", errno);
  if (::ftruncate(self.fd, offset) != 0) self.fail("ftruncate", errno);
  const int status = io_uring_queue_init(static_cast<unsigned>(self.options.queue_depth), &self.ring, 0);
  if (status < 0) self.fail("io_uring_queue_init", -status);
  self.ring_ready = true;
  // Buffers from the CPU allocator (so a counting allocator sees them), aligned by hand.
  const auto count = static_cast<std::size_t>(std::min<std::int64_t>(self.options.buffer_count,
                                                                      static_cast<std::int64_t>(self.groups.size())));
  c10::Allocator* allocator = c10::GetCPUAllocator();
  for (std::size_t b = 0; b < std::max<std::size_t>(count, 1); ++b) {
    self.storage.push_back(allocator->allocate(static_cast<std::size_t>(self.slot_bytes + alignment)));
    auto address = reinterpret_cast<std::uintptr_t>(self.storage.back().get());
    address = (address + alignment - 1) / alignment * alignment;
    self.aligned.push_back(reinterpret_cast<char*>(address));
    self.views.push_back(at::from_blob(self.aligned.back(), {self.slot_bytes / 4}, at::kFloat));
    self.pending.push_back(0);
    self.counters.buffer_bytes += self.slot_bytes + alignment;
  }
  self.reaper = std::thread([&self] { self.reap(); });
  // offload_param: the file takes the parameters now (the engine frees its
  // shards); bf16: the masters start as the partitions' values.
  if (options.parameters || options.masters) {
    for (std::size_t s = 0; s < parameters.size(); ++s) store_shard(s, parameters[s]);
  }
}

nvme_stream::~nvme_stream() {
  if (!impl_) return;
  impl& self = *impl_;
  try {
    for (std::size_t b = 0; b < self.pending.size(); ++b) self.wait(static_cast<int>(b));
  } catch (...) {
  }
  if (self.reaper.joinable()) {
    {
      // A no-op tagged as the stop request wakes the completion thread.
      std::lock_guard<std::mutex> lock(self.mutex);
      io_uring_sqe* sqe = io_uring_get_sqe(&self.ring);
      if (sqe != nullptr) {
        io_uring_prep_nop(sqe);
        io_uring_sqe_set_data64(sqe, ~0ULL);
        io_uring_submit(&self.ring);
      }
    }
    self.reaper.join();
  }
  if (self.ring_ready) io_uring_queue_exit(&self.ring);
  if (self.fd >= 0) ::close(self.fd);
  if (!self.path.empty()) ::unlink(self.path.c_str());
}

void nvme_stream::step(const adam_hyper& hyper, double grad_scale) {
  impl& self = *impl_;
  at::NoGradGuard no_grad;
  const auto g_count = static_cast<int>(self.groups.size());
  const auto b_count = static_cast<int>(self.views.size());
  const bool fresh = self.step == 0;  // the state starts at zero: nothing to read
  ++self.step;
  const double step = static_cast<double>(self.step);
  const double bias1 = 1 - std::pow(hyper.beta1, step);
  const double bias2 = 1 - std::pow(hyper.beta2, step);
  // The file holds each sub-group's parameters (offload_param) or masters (bf16).
  const bool parameters = self.options.parameters || self.options.masters;
  auto read = [&](int g) {
    const int b = g % b_count;
    const sub_group& group = self.groups[static_cast<std::size_t>(g)];
    if (fresh && !parameters) {
      self.views[static_cast<std::size_t>(b)].zero_();
      return;
    }
    self.transfer(b, /*write=*/false, group.file_offset, group.region_bytes());
  };
  for (int g = 0; g < std::min(g_count, std::max(1, b_count - 1)); ++g) read(g);
  for (int g = 0; g < g_count; ++g) {
    const int b = g % b_count;
    self.wait(b);
    const sub_group& group = self.groups[static_cast<std::size_t>(g)];
    const at::Tensor& buffer = self.views[static_cast<std::size_t>(b)];
    const std::int64_t state = group.param_bytes / 4;
    at::Tensor exp_avg = buffer.narrow(0, state, group.numel);
    at::Tensor exp_avg_sq = buffer.narrow(0, state + group.numel, group.numel);
    if (fresh && parameters) buffer.narrow(0, state, 2 * group.numel).zero_();  // Adam's state starts at zero
    // As LibTorch 1.13's Adam::step and AdamW::step, element for element.
    at::Tensor p = parameters ? buffer.narrow(0, 0, group.numel) : group.param;
    at::Tensor grad = group.grad.scalar_type() == at::kFloat ? group.grad : group.grad.to(at::kFloat);
    if (grad_scale != 1.0) grad = grad.mul(grad_scale);
    if (hyper.decoupled) {
      p.mul_(1 - hyper.lr * hyper.weight_decay);
    } else if (hyper.weight_decay != 0) {
      grad = grad.add(p, hyper.weight_decay);
    }
    exp_avg.mul_(hyper.beta1).add_(grad, 1 - hyper.beta1);
    exp_avg_sq.mul_(hyper.beta2).addcmul_(grad, grad, 1 - hyper.beta2);
    const at::Tensor denom = (exp_avg_sq.sqrt() / std::sqrt(bias2)).add_(hyper.eps);
    p.addcdiv_(exp_avg, denom, -hyper.lr / bias1);
    // bf16 with the partition in memory: the updated master cast back into it.
    if (self.options.masters && !self.options.parameters) group.param.copy_(p);
    self.transfer(b, /*write=*/true, group.file_offset, group.region_bytes());
    const int next = g + b_count - 1;
    if (b_count > 1 && next < g_count) {
      self.wait(next % b_count);  // the write of g - 1 leaves that buffer
      read(next);
    } else if (b_count == 1 && g + 1 < g_count) {
      self.wait(0);
      read(g + 1);
    }
  }
  for (int b = 0; b < b_count; ++b) self.wait(b);
  ++self.counters.steps;
}

adam_partition_state nvme_stream::read_state() {
  impl& self = *impl_;
  adam_partition_state out;
  out.step = self.step;
  if (self.step == 0) return out;  // nothing written yet: Adam has no state
  for (std::int64_t n : self.segment_numel) {
    out.exp_avg.push_back(at::empty({n}, at::kFloat));
    out.exp_avg_sq.push_back(at::empty({n}, at::kFloat));
  }
  for (const sub_group& group : self.groups) {
    self.wait(0);
    self.transfer(0, /*write=*/false, group.state_offset(), align_up(2 * group.numel * 4));
    self.wait(0);
    const at::Tensor& buffer = self.views.front();
    out.exp_avg[group.segment].narrow(0, group.begin, group.numel).copy_(buffer.narrow(0, 0, group.numel));
    out.exp_avg_sq[group.segment].narrow(0, group.begin, group.numel).copy_(buffer.narrow(0, group.numel, group.numel));
  }
  return out;
}

void nvme_stream::write_state(const adam_partition_state& state) {
  impl& self = *impl_;
  if (state.step == 0) {
    self.step = 0;  // the next step starts from zero state, as a fresh Adam
    return;
  }
  if (state.exp_avg.size() != self.segment_numel.size() || state.exp_avg_sq.size() != self.segment_numel.size()) {
    throw std::invalid_argument("deepspeed nvme offload: a state of " + std::to_string(state.exp_avg.size()) +
                                " segments for a stream of " + std::to_string(self.segment_numel.size()));
  }
  for (std::size_t s = 0; s < self.segment_numel.size(); ++s) {
    if (state.exp_avg[s].numel() != self.segment_numel[s] || state.exp_avg_sq[s].numel() != self.segment_numel[s]) {
      throw std::invalid_argument("deepspeed nvme offload: segment " + std::to_string(s) + " holds " +
                                  std::to_string(self.segment_numel[s]) + " elements, its state " +
                                  std::to_string(state.exp_avg[s].numel()));
    }
  }
  for (const sub_group& group : self.groups) {
    self.wait(0);
    const at::Tensor& buffer = self.views.front();
    buffer.narrow(0, 0, group.numel).copy_(state.exp_avg[group.segment].narrow(0, group.begin, group.numel));
    buffer.narrow(0, group.numel, group.numel).copy_(state.exp_avg_sq[group.segment].narrow(0, group.begin, group.numel));
    self.transfer(0, /*write=*/true, group.state_offset(), align_up(2 * group.numel * 4));
  }
  self.wait(0);
  self.step = state.step;
}

void nvme_stream::load_shard(std::size_t partition, const at::Tensor& shard) {
  impl& self = *impl_;
  at::NoGradGuard no_grad;
  for (const sub_group& group : self.groups) {
    if (group.segment != partition) continue;
    self.wait(0);
    self.transfer(0, /*write=*/false, group.file_offset, group.param_bytes);
    self.wait(0);
    shard.narrow(0, group.begin, group.numel).copy_(self.views.front().narrow(0, 0, group.numel));
  }
  ++self.counters.shard_loads;
}

void nvme_stream::store_shard(std::size_t partition, const at::Tensor& shard) {
  impl& self = *impl_;
  at::NoGradGuard no_grad;
  for (const sub_group& group : self.groups) {
    if (group.segment != partition) continue;
    self.wait(0);
    self.views.front().narrow(0, 0, group.numel).copy_(shard.narrow(0, group.begin, group.numel));
    self.transfer(0, /*write=*/true, group.file_offset, group.param_bytes);
  }
  self.wait(0);
  ++self.counters.shard_stores;
}

const nvme_counters& nvme_stream::counters() const noexcept { return impl_->counters; }
std::string nvme_stream::file() const { return impl_->path; }
std::vector<at::Tensor> nvme_stream::buffers() const { return impl_->views; }

}  // namespace loom::detail

namespace loom {

offload_io offload_io_so_far() noexcept {
  const detail::io_tally& tally = detail::process_io();
  return {tally.bytes_read.load(std::memory_order_relaxed), tally.bytes_written.load(std::memory_order_relaxed),
          tally.read_busy_ns.load(std::memory_order_relaxed), tally.write_busy_ns.load(std::memory_order_relaxed)};
}

}  // namespace loom
