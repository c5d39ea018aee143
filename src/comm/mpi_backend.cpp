// loom's c10d process group over MPI (mpi_backend.hpp).
#include "mpi_backend.hpp"
#include "mpi_error_text.hpp"
#include <loom/environment.hpp>

#include <loom/errors.hpp>

#include <ATen/ATen.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <limits>
#include <numeric>
#include <optional>

namespace loom::comm {

// A work whose future the progress thread completes; recvAnysource reports
// the sender.
class mpi_backend::work final : public c10d::Work {
 public:
  work(int rank, c10d::OpType type, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, type),
        outputs_(std::move(outputs)),
        future_(c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

  void complete(std::exception_ptr error) {
    if (error) future_->setError(error);
    else future_->markCompleted(c10::IValue(outputs_));
    finish(error);
  }
  int sourceRank() const override { return source; }
  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  int source = -1;

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

namespace {

// A blocking all-reduce in pieces of at most piece_bytes, one MPI_Allreduce
// each. OpenMPI's ring all-reduce mallocs count/size bytes of scratch per
// call; from 32 MiB of scratch (glibc's largest mmap threshold) that malloc
// is a fresh mmap whose page faults are paid on every call, and a large
// working set falls out of cache. Measured here (2 ranks, 64 MiB, raw
// OpenMPI 4.1): one call 21.0 ms; pieces of 16 MiB 11.2 ms, of 4 MiB
// 10.6 ms; at 16 MiB and below no change.
int all_reduce_in_pieces(void* data, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm, long long piece_bytes) {
  int element = 1;
  MPI_Type_size(type, &element);
  const int piece = static_cast<int>(std::max<long long>(1, piece_bytes / element));
  auto* bytes = static_cast<char*>(data);
  for (int offset = 0; offset < count; offset += piece) {
    const int length = std::min(piece, count - offset);
    const int code =
        MPI_Allreduce(MPI_IN_PLACE, bytes + static_cast<std::ptrdiff_t>(offset) * element, length, type, op, comm);
    if (code != MPI_SUCCESS) return code;
  }
  return MPI_SUCCESS;
}

// ---------------------------------------------------------------- dtypes
MPI_Datatype datatype_of(c10::ScalarType type) {
  switch (type) {
    case at::kFloat: return MPI_FLOAT;
    case at::kDouble: return MPI_DOUBLE;
    case at::kLong: return MPI_INT64_T;
    case at::kInt: return MPI_INT32_T;
    case at::kShort: return MPI_INT16_T;
    case at::kChar: return MPI_INT8_T;
    case at::kByte: return MPI_UINT8_T;
    case at::kBool: return MPI_C_BOOL;
    case at::kBFloat16:
    case at::kHalf: return MPI_UINT16_T;  // moved as bytes; reduced by loom's operations below
    default:
      throw configuration_error(std::string("mpi process group: tensors of ") + c10::toString(type) +
                                " are not supported (float, double, bf16, fp16 and the integer types are)");
  }
}

// bf16 and fp16: each pair added (multiplied, compared) in fp32, rounded once.
template <class T, class F>
void combine(void* in, void* inout, int* length, F f) {
  auto* a = static_cast<T*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *length; ++i) b[i] = T(f(static_cast<float>(a[i]), static_cast<float>(b[i])));
}
template <class T>
void sum16(void* in, void* inout, int* n, MPI_Datatype*) { combine<T>(in, inout, n, [](float x, float y) { return x + y; }); }
template <class T>
void prod16(void* in, void* inout, int* n, MPI_Datatype*) { combine<T>(in, inout, n, [](float x, float y) { return x * y; }); }
template <class T>
void min16(void* in, void* inout, int* n, MPI_Datatype*) { combine<T>(in, inout, n, [](float x, float y) { return std::min(x, y); }); }
template <class T>
void max16(void* in, void* inout, int* n, MPI_Datatype*) { combine<T>(in, inout, n, [](float x, float y) { return std::max(x, y); }); }

struct sixteen_bit_ops {
  MPI_Op bf16[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  MPI_Op half[4] = {MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL, MPI_OP_NULL};
  sixteen_bit_ops() {
    MPI_Op_create(&sum16<c10::BFloat16>, 1, &bf16[0]);
    MPI_Op_create(&prod16<c10::BFloat16>, 1, &bf16[1]);
    MPI_Op_create(&min16<c10::BFloat16>, 1, &bf16[2]);
    MPI_Op_create(&max16<c10::BFloat16>, 1, &bf16[3]);
    MPI_Op_create(&sum16<c10::Half>, 1, &half[0]);
    MPI_Op_create(&prod16<c10::Half>, 1, &half[1]);
    MPI_Op_create(&min16<c10::Half>, 1, &half[2]);
    MPI_Op_create(&max16<c10::Half>, 1, &half[3]);
  }
};
// Created once, after MPI_Init (MPI_Op_create needs it); never freed, as MPI
// frees them at MPI_Finalize.
const sixteen_bit_ops& sixteen_bit() {
  static const sixteen_bit_ops ops;
  return ops;
}

// The MPI operation for op on dtype (AVG: a sum, divided afterwards).
MPI_Op operation_of(const c10d::ReduceOp& op, c10::ScalarType type) {
  const bool sixteen = type == at::kBFloat16 || type == at::kHalf;
  const bool floating = at::isFloatingType(type);
  auto pick = [&](int index) {
    const auto& ops = sixteen_bit();
    return type == at::kBFloat16 ? ops.bf16[index] : ops.half[index];
  };
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG: return sixteen ? pick(0) : MPI_SUM;
    case c10d::ReduceOp::PRODUCT: return sixteen ? pick(1) : MPI_PROD;
    case c10d::ReduceOp::MIN: return sixteen ? pick(2) : MPI_MIN;
    case c10d::ReduceOp::MAX: return sixteen ? pick(3) : MPI_MAX;
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR:
      if (floating) {
        throw configuration_error("mpi process group: bitwise reductions take integer or bool tensors, not " +
                                  std::string(c10::toString(type)));
      }
      return op == c10d::ReduceOp::BAND ? MPI_BAND : op == c10d::ReduceOp::BOR ? MPI_BOR : MPI_BXOR;
    default:
      throw configuration_error("mpi process group: this reduction (PREMUL_SUM) is NCCL's; use sum, avg, product, "
                                "min, max or a bitwise one");
  }
}
bool is_mean(const c10d::ReduceOp& op) { return op == c10d::ReduceOp::AVG; }

// The shared-memory all-reduce's counterpart of op (AVG: its sum); none for
// the bitwise reductions, which stay with MPI.
std::optional<shared_memory_sum::op> shared_memory_op_of(const c10d::ReduceOp& op) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG: return shared_memory_sum::op::sum;
    case c10d::ReduceOp::PRODUCT: return shared_memory_sum::op::product;
    case c10d::ReduceOp::MIN: return shared_memory_sum::op::min;
    case c10d::ReduceOp::MAX: return shared_memory_sum::op::max;
    default: return std::nullopt;
  }
}

void check_one(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.size() != 1) {
    throw configuration_error(std::string("mpi process group: ") + what + " takes one tensor per call (one device "
                              "per process); got " + std::to_string(tensors.size()));
  }
  if (!tensors.front().device().is_cpu()) {
    throw configuration_error(std::string("mpi process group: ") + what + " takes CPU tensors (this MPI build "
                              "moves host memory); got one on " + tensors.front().device().str());
  }
}
// A contiguous tensor to hand to MPI (results are copied back when it is a
// copy); its dtype is checked here, in the caller's thread.
at::Tensor wire_of(const at::Tensor& tensor) {
  (void)datatype_of(tensor.scalar_type());
  return tensor.is_contiguous() ? tensor : tensor.contiguous();
}

int count_of(const at::Tensor& tensor) {
  if (tensor.numel() > std::numeric_limits<int>::max()) {
    throw configuration_error("mpi process group: " + std::to_string(tensor.numel()) + " elements exceed MPI's int "
                              "count; split the tensor");
  }
  return static_cast<int>(tensor.numel());
}

}  // namespace

// ------------------------------------------------------------ lifecycle
c10::intrusive_ptr<mpi_backend> mpi_backend::create(MPI_Comm parent, std::chrono::milliseconds timeout) {
  // A malformed LOOM_MPI_* setting fails here, before this rank touches MPI:
  // the process ends, and no peer waits for it in a collective.
  const settings chosen = settings::from_environment();
  int initialised = 0;
  MPI_Initialized(&initialised);
  int provided = MPI_THREAD_SINGLE;
  if (!initialised) {
    // OpenMPI's blocking calls poll: yield the core while they do (an
    // application that set it already keeps its choice).
    cluster::export_variable("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/false);
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided);
    // loom started MPI, so loom ends it (after main: the groups are gone by
    // then, and mpirun counts a process that never finalized as failed).
    std::atexit([] {
      int finalized = 0;
      MPI_Finalized(&finalized);
      if (!finalized) MPI_Finalize();
    });
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_MULTIPLE) {
    throw configuration_error("mpi process group: MPI provides thread level " + std::to_string(provided) +
                              ", and loom needs MPI_THREAD_MULTIPLE (its progress thread calls MPI while the "
                              "application's threads may): initialise MPI with MPI_Init_thread(..., "
                              "MPI_THREAD_MULTIPLE, ...)");
  }
  (void)sixteen_bit();
  MPI_Comm own = MPI_COMM_NULL;
  int code = MPI_Comm_dup(parent, &own);
  if (code != MPI_SUCCESS) throw peer_error("mpi process group: MPI_Comm_dup failed (code " + std::to_string(code) + ")");
  MPI_Comm_set_errhandler(own, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(own, &rank);
  MPI_Comm_size(own, &size);
  return c10::make_intrusive<mpi_backend>(own, rank, size, timeout, chosen);
}

c10::intrusive_ptr<mpi_backend> mpi_backend::create_subgroup(const mpi_backend& parent, const std::vector<int>& members,
                                                             std::chrono::milliseconds timeout) {
  MPI_Group whole = MPI_GROUP_NULL, part = MPI_GROUP_NULL;
  MPI_Comm_group(parent.comm_, &whole);
  MPI_Group_incl(whole, static_cast<int>(members.size()), members.data(), &part);
  MPI_Comm sub = MPI_COMM_NULL;
  const int code = MPI_Comm_create_group(parent.comm_, part, /*tag=*/0, &sub);
  MPI_Group_free(&part);
  MPI_Group_free(&whole);
  if (code != MPI_SUCCESS) parent.fail("MPI_Comm_create_group", code);
  MPI_Comm_set_errhandler(sub, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(sub, &rank);
  MPI_Comm_size(sub, &size);
  return c10::make_intrusive<mpi_backend>(sub, rank, size, timeout, parent.settings_);
}

mpi_backend::mpi_backend(MPI_Comm own, int rank, int size, std::chrono::milliseconds timeout, settings chosen)
    : compat::c10d_backend(rank, size),
      comm_(own),
      timeout_(timeout),
      settings_(chosen),
      shared_(shared_memory_sum::create(own, timeout, settings_.yield_window, settings_.shared_memory)) {
  thread_ = std::thread([this] { progress(); });
}

mpi_backend::settings mpi_backend::settings::from_environment() {
  constexpr long long most = std::numeric_limits<int>::max();
  return {
      .yield_window = std::chrono::microseconds(cluster::setting_integer("LOOM_MPI_YIELD_US", 0, 10'000'000).value_or(2000)),
      .blocking_bytes = cluster::setting_integer("LOOM_MPI_BLOCKING_BYTES", 0, most).value_or(1LL << 20),
      .piece_bytes = cluster::setting_integer("LOOM_MPI_PIECE_BYTES", 1, most).value_or(4LL << 20),
      .synchronous = cluster::setting_integer("LOOM_MPI_SYNCHRONOUS", 0, 1).value_or(0) == 1,
      .shared_memory = cluster::setting_integer("LOOM_MPI_SHARED_MEMORY", 0, 1).value_or(1) == 1,
  };
}

bool mpi_backend::runs_blocking(const at::Tensor& tensor) const noexcept {
  return static_cast<long long>(tensor.numel() * tensor.element_size()) >= settings_.blocking_bytes;
}

mpi_backend::~mpi_backend() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && comm_ != MPI_COMM_NULL) MPI_Comm_free(&comm_);
}

void mpi_backend::fail(const char* call, int code) const {
  throw peer_error(std::string(call) + " on rank " + std::to_string(getRank()) + " (mpi group of " +
                   std::to_string(getSize()) + ") failed: " + mpi_error_text(code));
}

c10::intrusive_ptr<c10d::Work> mpi_backend::enqueue(c10d::OpType type, const char* name,
                                                    std::function<MPI_Request()> start, std::function<void()> finish,
                                                    std::vector<at::Tensor> outputs) {
  release_retired();
  if (type != c10d::OpType::SEND && type != c10d::OpType::RECV && type != c10d::OpType::RECVANYSOURCE) ++sequence_;
  auto done = c10::make_intrusive<work>(getRank(), type, std::move(outputs));
  if (settings_.synchronous) {
    // For measurement only (bench/ddp_mpi_vs_gloo.sh): the operation runs to
    // its end in the caller, so nothing overlaps it. A receive waited before
    // its matching send is issued deadlocks in this mode. One caller at a
    // time: the shared-memory all-reduce's state is the progress thread's
    // alone in the normal mode.
    std::lock_guard<std::mutex> one_at_a_time(synchronous_mutex_);
    std::exception_ptr error;
    try {
      MPI_Request request = start();
      for (int flag = 0; !flag;) {
        MPI_Status status{};
        const int code = MPI_Test(&request, &flag, &status);
        if (code != MPI_SUCCESS) fail(name, code);
        if (flag) done->source = status.MPI_SOURCE;
        else std::this_thread::yield();
      }
      if (finish) finish();
    } catch (...) {
      error = std::current_exception();
    }
    ++completed_;
    done->complete(error);
    return done;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({name, std::move(start), std::move(finish), done});
  }
  wake_.notify_one();
  return done;
}

// The progress thread: each operation is started (MPI's non-blocking call)
// as soon as it is dequeued, in the order the caller issued them (every rank
// starts a group's collectives in the same order, which is all MPI asks);
// then every operation in flight is tested, and completed when done, in
// whatever order they finish (a receive posted before its matching send
// must not hold the send back). Between rounds that completed nothing the
// thread waits, 1 us doubling to 128 us, or until a new operation comes.
void mpi_backend::progress() {
  struct active {
    job work;
    MPI_Request request = MPI_REQUEST_NULL;
    std::chrono::steady_clock::time_point began;
  };
  std::vector<active> running;
  std::deque<job> arrived;
  // While operations are in flight the thread tests them and yields the
  // core between tests (a rank's compute thread, when runnable, gets it);
  // after yield_time without progress it sleeps between tests instead.
  const auto yield_time = settings_.yield_window;
  constexpr auto first_pause = std::chrono::microseconds(16);
  auto pause = first_pause;
  auto last_progress = std::chrono::steady_clock::now();
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mutex_);
      if (running.empty()) {
        wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      } else if (queue_.empty()) {
        if (std::chrono::steady_clock::now() - last_progress < yield_time) {
          lock.unlock();
          std::this_thread::yield();
          lock.lock();
        } else {
          wake_.wait_for(lock, pause, [&] { return stopping_ || !queue_.empty(); });
          pause = std::min(pause * 2, std::chrono::microseconds(128));
        }
      }
      if (stopping_ && queue_.empty()) break;
      arrived.swap(queue_);
    }
    if (!arrived.empty()) {
      pause = first_pause;
      last_progress = std::chrono::steady_clock::now();
    }
    for (auto& next : arrived) {
      try {
        const MPI_Request request = next.start();  // before next is moved from
        running.push_back({std::move(next), request, std::chrono::steady_clock::now()});
      } catch (...) {
        ++completed_;
        complete_and_retire(std::move(next.done), std::current_exception());
      }
    }
    arrived.clear();
    bool progressed = false;
    for (std::size_t i = 0; i < running.size();) {
      active& a = running[i];
      std::exception_ptr error;
      bool finished = false;
      try {
        int flag = 0;
        MPI_Status status{};
        const int code = MPI_Test(&a.request, &flag, &status);
        ++tests_;
        if (code != MPI_SUCCESS) fail(a.work.name, code);
        if (flag) {
          a.work.done->source = status.MPI_SOURCE;
          if (a.work.finish) a.work.finish();
          finished = true;
        } else if (timeout_.count() > 0 && std::chrono::steady_clock::now() - a.began > timeout_) {
          // MPI may still write into the buffers: they are kept (leaked) with the request.
          const std::string name = a.work.name;
          auto done = a.work.done;
          new active(std::move(a));
          a.work.done = done;
          throw peer_error(name + " on rank " +
                           std::to_string(getRank()) + " (mpi group of " + std::to_string(getSize()) +
                           "): no answer within the timeout of " + std::to_string(timeout_.count()) +
                           " ms (a rank stopped taking part)");
        }
      } catch (...) {
        error = std::current_exception();
        finished = true;
      }
      if (!finished) {
        ++i;
        continue;
      }
      ++completed_;
      auto done = a.work.done;
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      if (done) complete_and_retire(std::move(done), error);
      progressed = true;
    }
    if (progressed) {
      pause = first_pause;
      last_progress = std::chrono::steady_clock::now();
    }
  }
  // Stopped with operations in flight (their works were dropped unwaited):
  // MPI may still write into their buffers, which are kept.
  for (auto& a : running) new active(std::move(a));
}

void mpi_backend::complete_and_retire(c10::intrusive_ptr<work> done, std::exception_ptr error) {
  done->complete(error);
  std::lock_guard<std::mutex> lock(mutex_);
  retired_.push_back(std::move(done));  // no allocation once its capacity is reached
}

void mpi_backend::release_retired() {
  std::lock_guard<std::mutex> releasing(release_mutex_);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    releasing_.swap(retired_);
  }
  releasing_.clear();  // the tensors' last references may go here, outside mutex_
}

// ------------------------------------------------------------ collectives
c10::intrusive_ptr<c10d::Work> mpi_backend::broadcast(std::vector<at::Tensor>& tensors,
                                                      const c10d::BroadcastOptions& opts) {
  check_one(tensors, "broadcast");
  at::Tensor target = tensors.front();
  at::Tensor wire = wire_of(target);
  const int root = static_cast<int>(opts.rootRank);
  return enqueue(
      c10d::OpType::BROADCAST, "MPI_Ibcast",
      [=, this] {
        MPI_Request request = MPI_REQUEST_NULL;
        const int code =
            runs_blocking(wire)
                ? MPI_Bcast(wire.data_ptr(), count_of(wire), datatype_of(wire.scalar_type()), root, comm_)
                : MPI_Ibcast(wire.data_ptr(), count_of(wire), datatype_of(wire.scalar_type()), root, comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Ibcast", code);
        return request;
      },
      [=]() mutable {
        if (!wire.is_same(target)) target.copy_(wire);
      },
      tensors);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::allreduce(std::vector<at::Tensor>& tensors,
                                                      const c10d::AllreduceOptions& opts) {
  check_one(tensors, "allreduce");
  at::Tensor target = tensors.front();
  at::Tensor wire = wire_of(target);
  const MPI_Op op = operation_of(opts.reduceOp, wire.scalar_type());
  const bool mean = is_mean(opts.reduceOp);
  const int size = getSize();
  const auto shared_op = shared_memory_op_of(opts.reduceOp);
  const bool through_shared_memory =
      shared_ != nullptr && shared_op.has_value() && shared_memory_sum::handles(wire.scalar_type());
  return enqueue(
      c10d::OpType::ALLREDUCE, "MPI_Iallreduce",
      [=, this]() mutable {
        if (through_shared_memory) {
          shared_->all_reduce(wire, *shared_op);
          return MPI_REQUEST_NULL;  // done: MPI_Test completes a null request at once
        }
        MPI_Request request = MPI_REQUEST_NULL;
        const int code =
            runs_blocking(wire)
                ? all_reduce_in_pieces(wire.data_ptr(), count_of(wire), datatype_of(wire.scalar_type()), op, comm_,
                                       settings_.piece_bytes)
                : MPI_Iallreduce(MPI_IN_PLACE, wire.data_ptr(), count_of(wire), datatype_of(wire.scalar_type()), op,
                                 comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Iallreduce", code);
        return request;
      },
      [=]() mutable {
        if (mean) wire.div_(size);
        if (!wire.is_same(target)) target.copy_(wire);
      },
      tensors);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  check_one(tensors, "reduce");
  at::Tensor target = tensors.front();
  at::Tensor wire = wire_of(target);
  const MPI_Op op = operation_of(opts.reduceOp, wire.scalar_type());
  const bool mean = is_mean(opts.reduceOp);
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  const int size = getSize();
  return enqueue(
      c10d::OpType::REDUCE, "MPI_Ireduce",
      [=, this] {
        MPI_Request request;
        const int code = MPI_Ireduce(is_root ? MPI_IN_PLACE : wire.data_ptr(), is_root ? wire.data_ptr() : nullptr,
                                     count_of(wire), datatype_of(wire.scalar_type()), op, root, comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Ireduce", code);
        return request;
      },
      [=]() mutable {
        if (!is_root) return;
        if (mean) wire.div_(size);
        if (!wire.is_same(target)) target.copy_(wire);
      },
      tensors);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                            const c10d::AllgatherOptions&) {
  if (output.numel() != input.numel() * getSize() || output.scalar_type() != input.scalar_type()) {
    throw configuration_error("mpi process group: _allgather_base's output holds " + std::to_string(output.numel()) +
                              " elements for an input of " + std::to_string(input.numel()) + " on " +
                              std::to_string(getSize()) + " ranks (it needs size x input, of the same dtype)");
  }
  at::Tensor target = output;
  at::Tensor out = wire_of(output);
  at::Tensor in = wire_of(input);
  return enqueue(
      c10d::OpType::_ALLGATHER_BASE, "MPI_Iallgather",
      [=, this] {
        MPI_Request request = MPI_REQUEST_NULL;
        const MPI_Datatype type = datatype_of(in.scalar_type());
        const int code =
            runs_blocking(out)
                ? MPI_Allgather(in.data_ptr(), count_of(in), type, out.data_ptr(), count_of(in), type, comm_)
                : MPI_Iallgather(in.data_ptr(), count_of(in), type, out.data_ptr(), count_of(in), type, comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Iallgather", code);
        return request;
      },
      [=]() mutable {
        if (!out.is_same(target)) target.copy_(out);
      },
      {output});
}

c10::intrusive_ptr<c10d::Work> mpi_backend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                      std::vector<at::Tensor>& inputs,
                                                      const c10d::AllgatherOptions& opts) {
  check_one(inputs, "allgather");
  if (outputs.size() != 1 || static_cast<int>(outputs.front().size()) != getSize()) {
    throw configuration_error("mpi process group: allgather takes one list of " + std::to_string(getSize()) +
                              " output tensors");
  }
  const at::Tensor& input = inputs.front();
  for (const auto& o : outputs.front()) {
    if (o.sizes() != input.sizes() || o.scalar_type() != input.scalar_type()) {
      throw configuration_error("mpi process group: allgather's outputs must have the input's shape and dtype "
                                "(uneven shapes: gather sizes first, as loom's all_gather_per_rank does)");
    }
  }
  (void)opts;
  at::Tensor flat = at::empty({getSize() * input.numel()}, input.options());
  at::Tensor in = wire_of(input);
  std::vector<at::Tensor> targets = outputs.front();
  const std::int64_t n = input.numel();
  return enqueue(
      c10d::OpType::ALLGATHER, "MPI_Iallgather",
      [=, this] {
        MPI_Request request;
        const MPI_Datatype type = datatype_of(in.scalar_type());
        const int code = MPI_Iallgather(in.data_ptr(), count_of(in), type, flat.data_ptr(), count_of(in), type, comm_,
                                        &request);
        if (code != MPI_SUCCESS) fail("MPI_Iallgather", code);
        return request;
      },
      [=]() mutable {
        for (std::size_t r = 0; r < targets.size(); ++r) {
          targets[r].copy_(flat.narrow(0, static_cast<std::int64_t>(r) * n, n).view(targets[r].sizes()));
        }
      },
      outputs.front());
}

c10::intrusive_ptr<c10d::Work> mpi_backend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                   std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  check_one(inputs, "gather");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  if (is_root && (outputs.size() != 1 || static_cast<int>(outputs.front().size()) != getSize())) {
    throw configuration_error("mpi process group: gather's root takes one list of " + std::to_string(getSize()) +
                              " output tensors");
  }
  at::Tensor in = wire_of(inputs.front());
  const std::int64_t n = in.numel();
  at::Tensor flat = is_root ? at::empty({getSize() * n}, in.options()) : at::Tensor();
  std::vector<at::Tensor> targets = is_root ? outputs.front() : std::vector<at::Tensor>{};
  return enqueue(
      c10d::OpType::GATHER, "MPI_Igather",
      [=, this] {
        MPI_Request request;
        const MPI_Datatype type = datatype_of(in.scalar_type());
        const int code = MPI_Igather(in.data_ptr(), count_of(in), type, is_root ? flat.data_ptr() : nullptr,
                                     count_of(in), type, root, comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Igather", code);
        return request;
      },
      [=]() mutable {
        for (std::size_t r = 0; r < targets.size(); ++r) {
          targets[r].copy_(flat.narrow(0, static_cast<std::int64_t>(r) * n, n).view(targets[r].sizes()));
        }
      },
      targets);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::scatter(std::vector<at::Tensor>& outputs,
                                                    std::vector<std::vector<at::Tensor>>& inputs,
                                                    const c10d::ScatterOptions& opts) {
  check_one(outputs, "scatter");
  const int root = static_cast<int>(opts.rootRank);
  const bool is_root = root == getRank();
  if (is_root && (inputs.size() != 1 || static_cast<int>(inputs.front().size()) != getSize())) {
    throw configuration_error("mpi process group: scatter's root takes one list of " + std::to_string(getSize()) +
                              " input tensors");
  }
  at::Tensor target = outputs.front();
  at::Tensor out = wire_of(target);
  at::Tensor flat = is_root ? at::cat(inputs.front()).reshape({-1}).contiguous() : at::Tensor();
  return enqueue(
      c10d::OpType::SCATTER, "MPI_Iscatter",
      [=, this] {
        MPI_Request request;
        const MPI_Datatype type = datatype_of(out.scalar_type());
        const int code = MPI_Iscatter(is_root ? flat.data_ptr() : nullptr, count_of(out), type, out.data_ptr(),
                                      count_of(out), type, root, comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Iscatter", code);
        return request;
      },
      [=]() mutable {
        if (!out.is_same(target)) target.copy_(out);
      },
      outputs);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                 const c10d::ReduceScatterOptions& opts) {
  if (input.numel() != output.numel() * getSize() || output.scalar_type() != input.scalar_type()) {
    throw configuration_error("mpi process group: _reduce_scatter_base's input holds " + std::to_string(input.numel()) +
                              " elements for an output of " + std::to_string(output.numel()) + " on " +
                              std::to_string(getSize()) + " ranks (it needs size x output, of the same dtype)");
  }
  at::Tensor target = output;
  at::Tensor out = wire_of(output);
  at::Tensor in = wire_of(input);
  const MPI_Op op = operation_of(opts.reduceOp, in.scalar_type());
  const bool mean = is_mean(opts.reduceOp);
  const int size = getSize();
  return enqueue(
      c10d::OpType::_REDUCE_SCATTER_BASE, "MPI_Ireduce_scatter_block",
      [=, this] {
        MPI_Request request = MPI_REQUEST_NULL;
        const int code = runs_blocking(in) ? MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), count_of(out),
                                                                      datatype_of(in.scalar_type()), op, comm_)
                                           : MPI_Ireduce_scatter_block(in.data_ptr(), out.data_ptr(), count_of(out),
                                                                       datatype_of(in.scalar_type()), op, comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Ireduce_scatter_block", code);
        return request;
      },
      [=]() mutable {
        if (mean) out.div_(size);
        if (!out.is_same(target)) target.copy_(out);
      },
      {output});
}

c10::intrusive_ptr<c10d::Work> mpi_backend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ReduceScatterOptions& opts) {
  check_one(outputs, "reduce_scatter");
  if (inputs.size() != 1 || static_cast<int>(inputs.front().size()) != getSize()) {
    throw configuration_error("mpi process group: reduce_scatter takes one list of " + std::to_string(getSize()) +
                              " input tensors");
  }
  at::Tensor flat = at::cat(inputs.front()).reshape({-1}).contiguous();
  at::Tensor out = outputs.front();
  return _reduce_scatter_base(out, flat, opts);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                          std::vector<int64_t>& output_splits,
                                                          std::vector<int64_t>& input_splits,
                                                          const c10d::AllToAllOptions&) {
  const int size = getSize();
  // Splits are counts of rows (dimension 0); empty: equal parts.
  const std::int64_t in_row = input.dim() == 0 ? 1 : input.numel() / std::max<std::int64_t>(input.size(0), 1);
  const std::int64_t out_row = output.dim() == 0 ? 1 : output.numel() / std::max<std::int64_t>(output.size(0), 1);
  auto counts = [size](const std::vector<int64_t>& splits, const at::Tensor& t, std::int64_t row) {
    std::vector<int> count(static_cast<std::size_t>(size)), displacement(static_cast<std::size_t>(size));
    for (int r = 0; r < size; ++r) {
      const std::int64_t rows = splits.empty() ? t.size(0) / size : splits[static_cast<std::size_t>(r)];
      count[static_cast<std::size_t>(r)] = static_cast<int>(rows * row);
    }
    std::exclusive_scan(count.begin(), count.end(), displacement.begin(), 0);
    return std::make_pair(count, displacement);
  };
  if ((!input_splits.empty() && static_cast<int>(input_splits.size()) != size) ||
      (!output_splits.empty() && static_cast<int>(output_splits.size()) != size)) {
    throw configuration_error("mpi process group: alltoall_base's splits need one entry per rank (" +
                              std::to_string(size) + ")");
  }
  auto send = counts(input_splits, input, in_row);
  auto receive = counts(output_splits, output, out_row);
  at::Tensor target = output;
  at::Tensor out = wire_of(output);
  at::Tensor in = wire_of(input);
  return enqueue(
      c10d::OpType::ALLTOALL_BASE, "MPI_Ialltoallv",
      [=, this] {
        MPI_Request request;
        const MPI_Datatype type = datatype_of(in.scalar_type());
        const int code = MPI_Ialltoallv(in.data_ptr(), send.first.data(), send.second.data(), type, out.data_ptr(),
                                        receive.first.data(), receive.second.data(), type, comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Ialltoallv", code);
        return request;
      },
      [=]() mutable {
        if (!out.is_same(target)) target.copy_(out);
      },
      {output});
}

c10::intrusive_ptr<c10d::Work> mpi_backend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                     const c10d::AllToAllOptions& opts) {
  if (static_cast<int>(outputs.size()) != getSize() || static_cast<int>(inputs.size()) != getSize()) {
    throw configuration_error("mpi process group: alltoall takes " + std::to_string(getSize()) +
                              " input and output tensors");
  }
  (void)opts;
  // Counts in elements, one tensor per peer.
  std::vector<int> send_counts, send_displacements, receive_counts, receive_displacements;
  std::vector<at::Tensor> in_flat;
  for (const auto& t : inputs) {
    send_counts.push_back(count_of(t));
    in_flat.push_back(t.reshape({-1}));
  }
  for (const auto& t : outputs) receive_counts.push_back(count_of(t));
  send_displacements.resize(send_counts.size());
  receive_displacements.resize(receive_counts.size());
  std::exclusive_scan(send_counts.begin(), send_counts.end(), send_displacements.begin(), 0);
  std::exclusive_scan(receive_counts.begin(), receive_counts.end(), receive_displacements.begin(), 0);
  at::Tensor in = at::cat(in_flat).contiguous();
  at::Tensor out = at::empty({receive_displacements.back() + receive_counts.back()}, in.options());
  std::vector<at::Tensor> targets = outputs;
  return enqueue(
      c10d::OpType::ALLTOALL, "MPI_Ialltoallv",
      [=, this] {
        MPI_Request request;
        const MPI_Datatype type = datatype_of(in.scalar_type());
        const int code = MPI_Ialltoallv(in.data_ptr(), send_counts.data(), send_displacements.data(), type,
                                        out.data_ptr(), receive_counts.data(), receive_displacements.data(), type,
                                        comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Ialltoallv", code);
        return request;
      },
      [=]() mutable {
        for (std::size_t r = 0; r < targets.size(); ++r) {
          targets[r].copy_(out.narrow(0, receive_displacements[r], receive_counts[r]).view(targets[r].sizes()));
        }
      },
      outputs);
}

// ------------------------------------------------------------ point to point
c10::intrusive_ptr<c10d::Work> mpi_backend::send(std::vector<at::Tensor>& tensors, int destination, int tag) {
  check_one(tensors, "send");
  at::Tensor wire = wire_of(tensors.front());
  return enqueue(
      c10d::OpType::SEND, "MPI_Isend",
      [=, this] {
        MPI_Request request;
        const int code = MPI_Isend(wire.data_ptr(), count_of(wire), datatype_of(wire.scalar_type()), destination, tag,
                                   comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Isend", code);
        return request;
      },
      nullptr, tensors);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::recv(std::vector<at::Tensor>& tensors, int source, int tag) {
  check_one(tensors, "recv");
  at::Tensor target = tensors.front();
  at::Tensor wire = wire_of(target);
  return enqueue(
      c10d::OpType::RECV, "MPI_Irecv",
      [=, this] {
        MPI_Request request;
        const int code = MPI_Irecv(wire.data_ptr(), count_of(wire), datatype_of(wire.scalar_type()),
                                   source < 0 ? MPI_ANY_SOURCE : source, tag, comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Irecv", code);
        return request;
      },
      [=]() mutable {
        if (!wire.is_same(target)) target.copy_(wire);
      },
      tensors);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  return recv(tensors, -1, tag);
}

c10::intrusive_ptr<c10d::Work> mpi_backend::barrier(const c10d::BarrierOptions&) {
  return enqueue(
      c10d::OpType::BARRIER, "MPI_Ibarrier",
      [this] {
        MPI_Request request;
        const int code = MPI_Ibarrier(comm_, &request);
        if (code != MPI_SUCCESS) fail("MPI_Ibarrier", code);
        return request;
      },
      nullptr, {});
}

}  // namespace loom::comm
