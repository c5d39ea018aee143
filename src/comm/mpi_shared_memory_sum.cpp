// The MPI group's shared-memory all-reduce (mpi_shared_memory_sum.hpp).
#include "mpi_shared_memory_sum.hpp"

#include "mpi_error_text.hpp"

#include <loom/errors.hpp>

#include <ATen/core/Tensor.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <type_traits>

namespace loom::comm {

namespace {

// The segment: one page of header, one cache line per rank (its arrival
// counter, then the call's signature for each parity), then two slots of
// piece_bytes per rank.
constexpr std::size_t header_bytes = 4096;
constexpr std::size_t line_bytes = 64;
constexpr std::size_t signature_offset = 8;  // after the arrival counter
static_assert(shared_memory_sum::max_ranks * line_bytes <= header_bytes);
static_assert(signature_offset + 2 * sizeof(shared_memory_sum::call_signature) <= line_bytes);

std::string describe(const shared_memory_sum::call_signature& call) {
  static constexpr const char* names[] = {"sum", "product", "min", "max"};
  return std::to_string(call.elements) + " elements of " +
         c10::toString(static_cast<c10::ScalarType>(call.dtype)) + " (" + names[call.operation] + ")";
}

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  throw peer_error(std::string("mpi process group: ") + call + " while setting up its shared memory failed: " +
                   mpi_error_text(code));
}

// Rank 0's segment: created exclusively, its pages reserved (a full
// /dev/shm fails here, not later with SIGBUS), mapped. Null on failure.
void* create_segment(const char* name, std::size_t bytes) {
  const int fd = ::shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return nullptr;
  void* segment = ::posix_fallocate(fd, 0, static_cast<off_t>(bytes)) == 0
                      ? ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                      : MAP_FAILED;
  ::close(fd);
  return segment == MAP_FAILED ? nullptr : segment;
}

void* open_segment(const char* name, std::size_t bytes) {
  const int fd = ::shm_open(name, O_RDWR, 0);
  if (fd < 0) return nullptr;
  void* segment = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  ::close(fd);
  return segment == MAP_FAILED ? nullptr : segment;
}

}  // namespace

std::unique_ptr<shared_memory_sum> shared_memory_sum::create(MPI_Comm comm, std::chrono::milliseconds timeout,
                                                             std::chrono::microseconds yield_window, bool allowed) {
  int rank = 0, size = 1;
  check(MPI_Comm_rank(comm, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(comm, &size), "MPI_Comm_size");
  // Do all members share this node?
  MPI_Comm node = MPI_COMM_NULL;
  check(MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node), "MPI_Comm_split_type");
  int node_size = 0;
  if (node != MPI_COMM_NULL) {
    MPI_Comm_size(node, &node_size);
    MPI_Comm_free(&node);
  }
  // Every member decides alike, even when only some were told not to.
  int wanted = node_size == size && size >= 2 && size <= max_ranks && allowed ? 1 : 0;
  check(MPI_Allreduce(MPI_IN_PLACE, &wanted, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (wanted == 0) return nullptr;

  const std::size_t bytes = header_bytes + static_cast<std::size_t>(size) * 2 * piece_bytes;
  static std::atomic<unsigned> made{0};
  char name[64] = {};
  void* segment = nullptr;
  if (rank == 0) {
    std::snprintf(name, sizeof name, "/loom-sum-%d-%u", static_cast<int>(::getpid()), made++);
    segment = create_segment(name, bytes);
    if (segment == nullptr) {
      ::shm_unlink(name);
      name[0] = '\0';
    }
  }
  check(MPI_Bcast(name, sizeof name, MPI_CHAR, 0, comm), "MPI_Bcast");
  if (rank != 0 && name[0] != '\0') segment = open_segment(name, bytes);
  // Also the barrier after which nobody opens the name any more.
  int mapped = segment != nullptr ? 1 : 0;
  check(MPI_Allreduce(MPI_IN_PLACE, &mapped, 1, MPI_INT, MPI_MIN, comm), "MPI_Allreduce");
  if (rank == 0 && name[0] != '\0') ::shm_unlink(name);
  if (mapped == 0) {
    if (segment != nullptr) ::munmap(segment, bytes);
    return nullptr;
  }
  return std::make_unique<shared_memory_sum>(comm, segment, bytes, rank, size, timeout, yield_window);
}

shared_memory_sum::shared_memory_sum(MPI_Comm comm, void* segment, std::size_t bytes, int rank, int size,
                                     std::chrono::milliseconds timeout, std::chrono::microseconds yield_window)
    : comm_(comm), segment_(static_cast<std::byte*>(segment)), bytes_(bytes), rank_(rank), size_(size),
      timeout_(timeout), yield_window_(yield_window) {}

shared_memory_sum::~shared_memory_sum() { ::munmap(segment_, bytes_); }

std::byte* shared_memory_sum::slot(int rank, int parity) const noexcept {
  return segment_ + header_bytes + (static_cast<std::size_t>(rank) * 2 + static_cast<std::size_t>(parity)) * piece_bytes;
}

shared_memory_sum::call_signature* shared_memory_sum::signature(int rank, int parity) const noexcept {
  return reinterpret_cast<call_signature*>(segment_ + static_cast<std::size_t>(rank) * line_bytes + signature_offset) +
         parity;
}

std::atomic_ref<std::uint64_t> shared_memory_sum::arrival(int rank) const noexcept {
  return std::atomic_ref<std::uint64_t>(
      *reinterpret_cast<std::uint64_t*>(segment_ + static_cast<std::size_t>(rank) * line_bytes));
}

void shared_memory_sum::synchronise() {
  ++generation_;
  arrival(rank_).store(generation_, std::memory_order_release);
  const auto start = std::chrono::steady_clock::now();
  auto pause = std::chrono::microseconds(1);
  unsigned looks = 0;
  for (int r = 0; r < size_; ++r) {
    while (arrival(r).load(std::memory_order_acquire) < generation_) {
      // This runs on the progress thread, which tests nothing while it waits
      // here; a peer may be waiting, before it comes, for a message of ours
      // already in flight (a send whose fragments only our progress pushes).
      // MPI_Iprobe consumes nothing but runs OpenMPI's progress engine,
      // which moves every pending request of this process.
      // Every 16th look, so that a peer arriving now is seen at once.
      if ((++looks & 15) == 0) {
        int pending = 0;
        MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &pending, MPI_STATUS_IGNORE);
      }
      const auto waited = std::chrono::steady_clock::now() - start;
      if (waited < yield_window_) {
        std::this_thread::yield();
        continue;
      }
      if (timeout_.count() > 0 && waited > timeout_) {
        broken_ = true;
        std::string missing;
        for (int q = 0; q < size_; ++q) {
          if (arrival(q).load(std::memory_order_acquire) >= generation_) continue;
          missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        }
        throw peer_error("all_reduce through shared memory on rank " + std::to_string(rank_) + " (mpi group of " +
                         std::to_string(size_) + "): rank(s) " + missing + " did not arrive within the timeout of " +
                         std::to_string(timeout_.count()) + " ms (a rank stopped taking part)");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(128));
    }
  }
}

namespace {

// The reduction kernels: single-threaded (they run on the progress thread,
// beside the application's compute, as MPI's own reductions do), with no
// allocation and no dispatch per piece. The blocks of 16 let g++ -O2
// vectorise them (its cheap cost model refuses a loop that needs a scalar
// epilogue; measured 7.0 us per 256 KiB of float, as at::add_out).
constexpr std::int64_t block = 16;

// out[i] = f(out[i], in[i]); in never aliases out.
template <class T, class F>
void fold_into(T* __restrict out, const T* __restrict in, std::int64_t n, F f) {
  std::int64_t i = 0;
  for (; i + block <= n; i += block) {
    for (std::int64_t j = 0; j < block; ++j) out[i + j] = f(out[i + j], in[i + j]);
  }
  for (; i < n; ++i) out[i] = f(out[i], in[i]);
}

// out[i] = f(a[i], b[i]); out aliases neither.
template <class T, class F>
void combine_into(T* __restrict out, const T* __restrict a, const T* __restrict b, std::int64_t n, F f) {
  std::int64_t i = 0;
  for (; i + block <= n; i += block) {
    for (std::int64_t j = 0; j < block; ++j) out[i + j] = f(a[i + j], b[i + j]);
  }
  for (; i < n; ++i) out[i] = f(a[i], b[i]);
}

// The operation on T; bf16 and fp16 combine in fp32 and round once, as the
// MPI path's operations do. min and max propagate NaN.
template <class T>
auto function_of(shared_memory_sum::op operation) {
  using wide = std::conditional_t<std::is_same_v<T, c10::BFloat16> || std::is_same_v<T, c10::Half>, float, T>;
  return [operation](T x, T y) -> T {
    const wide a = static_cast<wide>(x), b = static_cast<wide>(y);
    switch (operation) {
      case shared_memory_sum::op::sum: return static_cast<T>(a + b);
      case shared_memory_sum::op::product: return static_cast<T>(a * b);
      case shared_memory_sum::op::min: return static_cast<T>(b < a ? b : (b != b ? b : a));
      case shared_memory_sum::op::max: return static_cast<T>(b > a ? b : (b != b ? b : a));
    }
    return x;
  };
}

// Specialised per operation, so that the switch leaves the inner loops.
template <class T, shared_memory_sum::op operation>
T apply(T x, T y) {
  return function_of<T>(operation)(x, y);
}

// Reduces one piece: out = slot 0 (op) slot 1 (op) ... in rank order, on
// every rank. out holds this rank's own values, so it stands for this
// rank's slot where the result is the same bit for bit: rank 0's left
// operand, and rank 1's right one in a sum or product (commutative in IEEE
// arithmetic; min and max are not, for signed zeros). One stream less.
template <class T, shared_memory_sum::op operation>
void reduce_piece(T* out, const std::array<const T*, shared_memory_sum::max_ranks>& slots, int rank, int size,
                  std::int64_t n) {
  constexpr bool commutes = operation == shared_memory_sum::op::sum || operation == shared_memory_sum::op::product;
  const auto f = [](T x, T y) { return apply<T, operation>(x, y); };
  if (rank == 0) fold_into(out, slots[1], n, f);
  else if (rank == 1 && commutes) fold_into(out, slots[0], n, f);
  else combine_into(out, slots[0], slots[1], n, f);
  for (int r = 2; r < size; ++r) fold_into(out, slots[static_cast<std::size_t>(r)], n, f);
}

template <class T>
void reduce_piece(shared_memory_sum::op operation, std::byte* out, const std::array<const std::byte*, shared_memory_sum::max_ranks>& slots,
                  int rank, int size, std::int64_t n) {
  std::array<const T*, shared_memory_sum::max_ranks> typed{};
  for (int r = 0; r < size; ++r) typed[static_cast<std::size_t>(r)] = reinterpret_cast<const T*>(slots[static_cast<std::size_t>(r)]);
  T* target = reinterpret_cast<T*>(out);
  switch (operation) {
    case shared_memory_sum::op::sum: return reduce_piece<T, shared_memory_sum::op::sum>(target, typed, rank, size, n);
    case shared_memory_sum::op::product: return reduce_piece<T, shared_memory_sum::op::product>(target, typed, rank, size, n);
    case shared_memory_sum::op::min: return reduce_piece<T, shared_memory_sum::op::min>(target, typed, rank, size, n);
    case shared_memory_sum::op::max: return reduce_piece<T, shared_memory_sum::op::max>(target, typed, rank, size, n);
  }
}

using piece_reducer = void (*)(shared_memory_sum::op, std::byte*, const std::array<const std::byte*, shared_memory_sum::max_ranks>&,
                               int, int, std::int64_t);

// The kernel for type; none for bool and complex, which stay with MPI.
piece_reducer reducer_of(c10::ScalarType type) {
  switch (type) {
    case at::kFloat: return &reduce_piece<float>;
    case at::kDouble: return &reduce_piece<double>;
    case at::kBFloat16: return &reduce_piece<c10::BFloat16>;
    case at::kHalf: return &reduce_piece<c10::Half>;
    case at::kLong: return &reduce_piece<std::int64_t>;
    case at::kInt: return &reduce_piece<std::int32_t>;
    case at::kShort: return &reduce_piece<std::int16_t>;
    case at::kChar: return &reduce_piece<std::int8_t>;
    case at::kByte: return &reduce_piece<std::uint8_t>;
    default: return nullptr;
  }
}

}  // namespace

bool shared_memory_sum::handles(c10::ScalarType type) noexcept { return reducer_of(type) != nullptr; }

// Every rank sees the same signatures, so every rank throws alike, after the
// same number of synchronisations: the counters stay in step, nothing was
// reduced, and the group stays usable. (A peer that reads this piece's
// signature has not arrived at the next piece, so nobody overwrites it yet:
// the slots' own argument.)
void shared_memory_sum::check_signatures(const call_signature& call, int parity) const {
  std::string calls;
  bool differ = false;
  for (int r = 0; r < size_; ++r) {
    const call_signature theirs = *signature(r, parity);
    differ = differ || !(theirs == call);
    calls += (r ? ", rank " : "rank ") + std::to_string(r) + " has " + describe(theirs);
  }
  if (!differ) return;
  throw peer_error("all_reduce through shared memory on rank " + std::to_string(rank_) + " (mpi group of " +
                   std::to_string(size_) + "): the ranks' calls differ: " + calls +
                   ". Every rank must all_reduce the same number of elements, dtype and reduction, in the same order; "
                   "nothing was reduced");
}

void shared_memory_sum::all_reduce(at::Tensor& tensor, op operation) {
  if (broken_) {
    throw peer_error("all_reduce through shared memory on rank " + std::to_string(rank_) +
                     ": an earlier wait timed out, so the members' counters are out of step; make a new group");
  }
  const piece_reducer reduce = reducer_of(tensor.scalar_type());
  const std::int64_t element = tensor.element_size();
  const std::int64_t per_piece = static_cast<std::int64_t>(piece_bytes) / element;
  const std::int64_t count = tensor.numel();
  const call_signature call{count, static_cast<std::int32_t>(tensor.scalar_type()), static_cast<std::int32_t>(operation)};
  auto* data = static_cast<std::byte*>(tensor.data_ptr());
  std::array<const std::byte*, max_ranks> slots{};
  // At least one piece, even of nothing: the first piece carries the call's
  // signature, which every rank checks before it reduces anything.
  std::int64_t offset = 0;
  do {
    const std::int64_t length = std::min(per_piece, count - offset);
    const int parity = static_cast<int>(pieces_++ % 2);
    std::byte* mine = data + offset * element;
    if (offset == 0) *signature(rank_, parity) = call;  // published by the arrival's release
    // An empty tensor's data may be null, which memcpy may not be given even
    // for no bytes (UBSan, the empty all-reduce of tests/dist/mpi_collectives.cpp).
    if (length > 0) std::memcpy(slot(rank_, parity), mine, static_cast<std::size_t>(length * element));
    synchronise();
    if (offset == 0) check_signatures(call, parity);
    for (int r = 0; r < size_; ++r) slots[static_cast<std::size_t>(r)] = slot(r, parity);
    reduce(operation, mine, slots, rank_, size_, length);
    offset += length;
  } while (offset < count);
  reductions_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace loom::comm
