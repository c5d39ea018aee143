// The MPI group's shared-memory all-reduce (mpi_shared_memory_sum.hpp).
#include "mpi_shared_memory_sum.hpp"

#include <loom/errors.hpp>

#include <ATen/ATen.h>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>

namespace loom::comm {

namespace {

// The segment: one page of arrival counters (one cache line per rank), then
// two slots of piece_bytes per rank.
constexpr std::size_t header_bytes = 4096;
constexpr std::size_t line_bytes = 64;
static_assert(shared_memory_sum::max_ranks * line_bytes <= header_bytes);

// How long a wait yields the core before it sleeps between looks (the MPI
// progress thread's default yield window).
constexpr auto yield_window = std::chrono::microseconds(2000);

void check(int code, const char* call) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw peer_error(std::string("mpi process group: ") + call + " while setting up its shared memory failed: " +
                   std::string(text, static_cast<std::size_t>(length)));
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

std::unique_ptr<shared_memory_sum> shared_memory_sum::create(MPI_Comm comm, std::chrono::milliseconds timeout) {
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
  const char* setting = std::getenv("LOOM_MPI_SHARED_MEMORY");
  const bool refused = setting != nullptr && std::string(setting) == "0";
  // Every member decides alike, even with LOOM_MPI_SHARED_MEMORY set on some.
  int wanted = node_size == size && size >= 2 && size <= max_ranks && !refused ? 1 : 0;
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
  return std::make_unique<shared_memory_sum>(comm, segment, bytes, rank, size, timeout);
}

shared_memory_sum::shared_memory_sum(MPI_Comm comm, void* segment, std::size_t bytes, int rank, int size,
                                     std::chrono::milliseconds timeout)
    : comm_(comm), segment_(static_cast<std::byte*>(segment)), bytes_(bytes), rank_(rank), size_(size),
      timeout_(timeout) {}

shared_memory_sum::~shared_memory_sum() { ::munmap(segment_, bytes_); }

bool shared_memory_sum::handles(c10::ScalarType type) noexcept {
  return type != at::kBool && !at::isComplexType(type) &&
         (at::isFloatingType(type) || at::isIntegralType(type, /*includeBool=*/false));
}

std::byte* shared_memory_sum::slot(int rank, int parity) const noexcept {
  return segment_ + header_bytes + (static_cast<std::size_t>(rank) * 2 + static_cast<std::size_t>(parity)) * piece_bytes;
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
      if (waited < yield_window) {
        std::this_thread::yield();
        continue;
      }
      if (timeout_.count() > 0 && waited > timeout_) {
        broken_ = true;
        std::string missing;
        for (int q = 0; q < size_; ++q) {
          if (arrival(q).load(std::memory_order_acquire) < generation_) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
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

void shared_memory_sum::all_reduce(at::Tensor& tensor, op operation) {
  if (broken_) {
    throw peer_error("all_reduce through shared memory on rank " + std::to_string(rank_) +
                     ": an earlier wait timed out, so the members' counters are out of step; make a new group");
  }
  const std::int64_t element = tensor.element_size();
  const std::int64_t per_piece = static_cast<std::int64_t>(piece_bytes) / element;
  const std::int64_t count = tensor.numel();
  auto* data = static_cast<std::byte*>(tensor.data_ptr());
  const auto options = tensor.options();
  for (std::int64_t offset = 0; offset < count; offset += per_piece) {
    const std::int64_t length = std::min(per_piece, count - offset);
    const int parity = static_cast<int>(pieces_++ % 2);
    std::byte* mine = data + offset * element;
    std::memcpy(slot(rank_, parity), mine, static_cast<std::size_t>(length * element));
    synchronise();
    // Every rank: out = slot 0 (op) slot 1 (op) ... in rank order. out
    // holds this rank's own values, so it stands for this rank's slot where
    // the result is the same bit for bit: rank 0's left operand, and rank
    // 1's right one in a sum or product (commutative in IEEE arithmetic;
    // min and max are not, for signed zeros). One stream less to read.
    at::Tensor out = at::from_blob(mine, {length}, options);
    auto piece_of = [&](int r) { return at::from_blob(slot(r, parity), {length}, options); };
    const bool commutes = operation == op::sum || operation == op::product;
    const at::Tensor left = rank_ == 0 ? out : piece_of(0);
    const at::Tensor right = rank_ == 1 && commutes ? out : piece_of(1);
    switch (operation) {
      case op::sum:
        at::add_out(out, left, right);
        for (int r = 2; r < size_; ++r) out.add_(piece_of(r));
        break;
      case op::product:
        at::mul_out(out, left, right);
        for (int r = 2; r < size_; ++r) out.mul_(piece_of(r));
        break;
      case op::min:
        at::minimum_out(out, left, right);
        for (int r = 2; r < size_; ++r) at::minimum_out(out, out, piece_of(r));
        break;
      case op::max:
        at::maximum_out(out, left, right);
        for (int r = 2; r < size_; ++r) at::maximum_out(out, out, piece_of(r));
        break;
    }
  }
  reductions_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace loom::comm
