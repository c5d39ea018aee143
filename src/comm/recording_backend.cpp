#include "recording_backend.hpp"

#include <c10/core/ScalarType.h>

#include <chrono>
#include <mutex>
#include <sstream>

namespace loom::comm {

namespace {
const at::Tensor* first(const std::vector<at::Tensor>& tensors) { return tensors.empty() ? nullptr : &tensors[0]; }

// This process's traffic, every group together.
struct atomic_traffic_count {
  std::atomic<std::uint64_t> collectives{0};
  std::atomic<std::uint64_t> payload_bytes{0};
};
std::array<atomic_traffic_count, collective_kinds> process_traffic;

// The union of the intervals during which collectives were in flight: a
// count of those open, when the count last rose from 0, and the closed
// total. Begin and end come from different threads (the caller, Gloo's
// completion): a mutex, taken only while timing or tracing is on (it
// guards the trace too).
std::atomic<bool> timing_on{false};
std::atomic<std::vector<traced_collective>*> trace_sink{nullptr};
struct in_flight_clock {
  std::mutex mutex;
  int open = 0;
  std::int64_t since_ns = 0;
  std::int64_t total_ns = 0;
};
in_flight_clock in_flight;

std::int64_t now_ns() noexcept {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A timed collective ends when its work completes (its future's callback,
// on the thread that completes it); a work without a future ends now.
void complete_with(const c10::intrusive_ptr<c10d::Work>& work) noexcept {
  try {
    work->getFuture()->addCallback([](c10::ivalue::Future&) { collective_completed(); });
  } catch (...) {
    collective_completed();
  }
}

template <class Call>
c10::intrusive_ptr<c10d::Work> run_timed(bool timed, Call&& call) {
  if (!timed) return call();
  c10::intrusive_ptr<c10d::Work> work;
  try {
    work = call();
  } catch (...) {
    collective_completed();
    throw;
  }
  complete_with(work);
  return work;
}
}  // namespace

bool note_traffic(collective_kind kind, std::uint64_t payload_bytes, int group_size) noexcept {
  auto& count = process_traffic[static_cast<std::size_t>(kind)];
  count.collectives.fetch_add(1, std::memory_order_relaxed);
  count.payload_bytes.fetch_add(payload_bytes, std::memory_order_relaxed);
  const bool timed = timing_on.load(std::memory_order_relaxed);
  std::vector<traced_collective>* trace = trace_sink.load(std::memory_order_relaxed);
  if (!timed && trace == nullptr) return false;
  std::lock_guard<std::mutex> lock(in_flight.mutex);
  if (trace != nullptr) {
    try {
      trace->push_back({kind, payload_bytes, group_size});
    } catch (...) {
      // Out of memory: the trace misses one; the collective goes on.
    }
  }
  if (timed && in_flight.open++ == 0) in_flight.since_ns = now_ns();
  return timed;
}

void collective_completed() noexcept {
  std::lock_guard<std::mutex> lock(in_flight.mutex);
  if (--in_flight.open == 0) in_flight.total_ns += now_ns() - in_flight.since_ns;
}

void time_collectives(bool on) noexcept { timing_on.store(on, std::memory_order_relaxed); }

void trace_collectives(std::vector<traced_collective>* trace) noexcept {
  std::lock_guard<std::mutex> lock(in_flight.mutex);  // no append is under way once it returns
  trace_sink.store(trace, std::memory_order_relaxed);
}

traffic traffic_so_far() noexcept {
  traffic now;
  for (std::size_t k = 0; k < collective_kinds; ++k) {
    now.by_kind[k] = {process_traffic[k].collectives.load(std::memory_order_relaxed),
                      process_traffic[k].payload_bytes.load(std::memory_order_relaxed)};
  }
  std::lock_guard<std::mutex> lock(in_flight.mutex);
  now.in_flight_ns = in_flight.total_ns + (in_flight.open > 0 ? now_ns() - in_flight.since_ns : 0);
  return now;
}

const char* name_of(collective_kind kind) noexcept {
  switch (kind) {
    case collective_kind::broadcast: return "broadcast";
    case collective_kind::all_reduce: return "all_reduce";
    case collective_kind::all_reduce_coalesced: return "all_reduce_coalesced";
    case collective_kind::reduce: return "reduce";
    case collective_kind::all_gather: return "all_gather";
    case collective_kind::all_gather_coalesced: return "all_gather_coalesced";
    case collective_kind::gather: return "gather";
    case collective_kind::scatter: return "scatter";
    case collective_kind::reduce_scatter: return "reduce_scatter";
    case collective_kind::all_to_all: return "all_to_all";
    case collective_kind::barrier: return "barrier";
  }
  return "collective";
}

std::string collective_entry::describe() const {
  std::ostringstream out;
  out << name_of(kind);
  if (dtype < 0) return out.str();
  out << '(' << c10::toString(static_cast<c10::ScalarType>(dtype));
  if (rank >= 0) {
    out << '[';
    for (int d = 0; d < rank; ++d) out << (d ? ", " : "") << shape[static_cast<std::size_t>(d)];
    out << ']';
  }
  out << ')';
  return out.str();
}

bool collective_entry::matches(const collective_entry& other) const noexcept {
  if (kind != other.kind || dtype != other.dtype) return false;
  if (rank < 0 || other.rank < 0) return true;
  if (rank != other.rank) return false;
  for (int d = 0; d < rank; ++d) {
    if (shape[static_cast<std::size_t>(d)] != other.shape[static_cast<std::size_t>(d)]) return false;
  }
  return true;
}

std::optional<collective_entry> collective_recorder::at(std::uint64_t sequence) const noexcept {
  const slot& s = ring_[sequence & (capacity - 1)];
  if (s.words[0].load(std::memory_order_acquire) != sequence) return std::nullopt;
  const std::uint64_t header = s.words[1].load(std::memory_order_relaxed);
  collective_entry entry;
  entry.sequence = sequence;
  entry.kind = static_cast<collective_kind>(header & 0xff);
  entry.dtype = static_cast<std::int8_t>(static_cast<std::uint8_t>((header >> 8) & 0xff));
  entry.rank = static_cast<std::int8_t>(static_cast<std::uint8_t>((header >> 16) & 0xff));
  entry.entered_ns = static_cast<std::int64_t>(s.words[2].load(std::memory_order_relaxed));
  for (int d = 0; d < entry.rank && d < collective_entry::max_rank; ++d) {
    entry.shape[static_cast<std::size_t>(d)] = static_cast<std::int64_t>(s.words[3 + d].load(std::memory_order_relaxed));
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  if (s.words[0].load(std::memory_order_relaxed) != sequence) return std::nullopt;
  return entry;
}

std::vector<collective_entry> collective_recorder::recent(std::size_t count) const {
  const std::uint64_t end = entered();
  const std::uint64_t begin = end > count ? end - count : 0;
  std::vector<collective_entry> entries;
  for (std::uint64_t sequence = begin; sequence < end; ++sequence) {
    if (auto entry = at(sequence)) entries.push_back(*entry);
  }
  return entries;
}

recording_backend::recording_backend(c10::intrusive_ptr<compat::c10d_backend> inner,
                                     std::shared_ptr<collective_recorder> recorder)
    : compat::c10d_backend(inner->getRank(), inner->getSize()), inner_(std::move(inner)),
      recorder_(std::move(recorder)) {}

c10::intrusive_ptr<c10d::Work> recording_backend::broadcast(std::vector<at::Tensor>& tensors,
                                                            const c10d::BroadcastOptions& opts) {
  const bool timed = recorder_->record(collective_kind::broadcast, first(tensors), bytes_of(tensors));
  return run_timed(timed, [&] { return inner_->broadcast(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::allreduce(std::vector<at::Tensor>& tensors,
                                                            const c10d::AllreduceOptions& opts) {
  const bool timed = recorder_->record(collective_kind::all_reduce, first(tensors), bytes_of(tensors));
  return run_timed(timed, [&] { return inner_->allreduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                      const c10d::AllreduceCoalescedOptions& opts) {
  const bool timed = recorder_->record(collective_kind::all_reduce_coalesced, first(tensors), bytes_of(tensors));
  return run_timed(timed, [&] { return inner_->allreduce_coalesced(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::reduce(std::vector<at::Tensor>& tensors,
                                                         const c10d::ReduceOptions& opts) {
  const bool timed = recorder_->record(collective_kind::reduce, first(tensors), bytes_of(tensors));
  return run_timed(timed, [&] { return inner_->reduce(tensors, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllgatherOptions& opts) {
  const bool timed =
      recorder_->record(collective_kind::all_gather, first(inputs), all_chunks(bytes_of(inputs), getSize()));
  return run_timed(timed, [&] { return inner_->allgather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                  const c10d::AllgatherOptions& opts) {
  const bool timed = recorder_->record(collective_kind::all_gather, &input, bytes_of(output));
  return run_timed(timed, [&] { return inner_->_allgather_base(output, input, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                                      std::vector<at::Tensor>& inputs,
                                                                      const c10d::AllgatherOptions& opts) {
  const bool timed = recorder_->record(collective_kind::all_gather_coalesced, first(inputs),
                    all_chunks(bytes_of(inputs), getSize()));
  return run_timed(timed, [&] { return inner_->allgather_coalesced(outputs, inputs, opts); });
}

// The root passes lists the others do not: dtype only.
c10::intrusive_ptr<c10d::Work> recording_backend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::GatherOptions& opts) {
  const bool timed = recorder_->record(collective_kind::gather, first(inputs), all_chunks(bytes_of(inputs), getSize()),
                    /*compare_shape=*/false);
  return run_timed(timed, [&] { return inner_->gather(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ScatterOptions& opts) {
  const bool timed =
      recorder_->record(collective_kind::scatter, first(outputs), all_chunks(bytes_of(outputs), getSize()),
                    /*compare_shape=*/false);
  return run_timed(timed, [&] { return inner_->scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                 std::vector<std::vector<at::Tensor>>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) {
  const bool timed = recorder_->record(collective_kind::reduce_scatter, first(outputs),
                                       all_chunks(bytes_of(outputs), getSize()));
  return run_timed(timed, [&] { return inner_->reduce_scatter(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                       const c10d::ReduceScatterOptions& opts) {
  const bool timed = recorder_->record(collective_kind::reduce_scatter, &output, bytes_of(input));
  return run_timed(timed, [&] { return inner_->_reduce_scatter_base(output, input, opts); });
}

// Splits may differ by rank: dtype only.
c10::intrusive_ptr<c10d::Work> recording_backend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                std::vector<int64_t>& output_splits,
                                                                std::vector<int64_t>& input_splits,
                                                                const c10d::AllToAllOptions& opts) {
  const bool timed = recorder_->record(collective_kind::all_to_all, &input, bytes_of(input), /*compare_shape=*/false);
  return run_timed(timed, [&] { return inner_->alltoall_base(output, input, output_splits, input_splits, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::alltoall(std::vector<at::Tensor>& outputs,
                                                           std::vector<at::Tensor>& inputs,
                                                           const c10d::AllToAllOptions& opts) {
  const bool timed =
      recorder_->record(collective_kind::all_to_all, first(inputs), bytes_of(inputs), /*compare_shape=*/false);
  return run_timed(timed, [&] { return inner_->alltoall(outputs, inputs, opts); });
}

c10::intrusive_ptr<c10d::Work> recording_backend::send(std::vector<at::Tensor>& tensors, int destination, int tag) {
  return inner_->send(tensors, destination, tag);
}

c10::intrusive_ptr<c10d::Work> recording_backend::recv(std::vector<at::Tensor>& tensors, int source, int tag) {
  return inner_->recv(tensors, source, tag);
}

c10::intrusive_ptr<c10d::Work> recording_backend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return inner_->recvAnysource(tensors, tag);
}

c10::intrusive_ptr<c10d::Work> recording_backend::barrier(const c10d::BarrierOptions& opts) {
  const bool timed = recorder_->record(collective_kind::barrier, nullptr, std::uint64_t{0});
  return run_timed(timed, [&] { return inner_->barrier(opts); });
}

void recording_backend::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const timed_collective timing(recorder_->record(collective_kind::barrier, nullptr, std::uint64_t{0}));
  inner_->monitoredBarrier(opts, wait_all_ranks);
}

}  // namespace loom::comm
