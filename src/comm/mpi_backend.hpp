// A c10d process group over MPI, written for loom (Debian's LibTorch is
// built without c10d's ProcessGroupMPI: its header ships, its symbols do
// not). It derives from compat::c10d_backend (c10d::ProcessGroup in 1.13,
// c10d::Backend in 2.x), so DDP's Reducer, the sharding engine and loom's
// collectives run on it unchanged.
//
// - The communicator is the caller's, duplicated (MPI_Comm_dup): loom's
//   messages never match the application's. The duplicate returns errors
//   (MPI_ERRORS_RETURN) instead of aborting, so a failure becomes a
//   loom::peer_error that names the rank and the call.
// - Every operation is queued to one progress thread, which starts MPI's
//   non-blocking form of it (MPI_Iallreduce, ...) and completes the work's
//   future when MPI_Test says it is done. The thread never spins: between
//   tests it sleeps, 1 us doubling to 128 us (a spinning waiter halves the
//   compute of a rank that shares a core with it: 2.0x measured here).
// - MPI must provide MPI_THREAD_MULTIPLE (the application's threads and
//   loom's progress thread may call MPI at once): an application that
//   initialised MPI with less is refused with a sentence saying so.
// - All-reduces among ranks of one node go through loom's shared
//   memory (mpi_shared_memory_sum.hpp); the rest through MPI.
// - bf16 and fp16 are reduced by user-defined MPI operations that add in
//   fp32 and round once per pair; AVG is a sum divided by the group size.
// Compiled only with the `mpi` Meson feature (LOOM_WITH_MPI).
#pragma once

#include "mpi_shared_memory_sum.hpp"

#include <loom/compat_c10d.hpp>

// The C API only (OpenMPI's deprecated C++ bindings stay out).
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace loom::comm {

class mpi_backend final : public compat::c10d_backend {
 public:
  // Initialises MPI (MPI_THREAD_MULTIPLE) when nobody has; a communicator
  // of the application's (MPI_COMM_WORLD or a split of it) is duplicated.
  static c10::intrusive_ptr<mpi_backend> create(MPI_Comm parent, std::chrono::milliseconds timeout);
  // The members (ranks of parent) as a group of their own
  // (MPI_Comm_create_group: collective over the members only).
  static c10::intrusive_ptr<mpi_backend> create_subgroup(const mpi_backend& parent, const std::vector<int>& members,
                                                         std::chrono::milliseconds timeout);

  // The LOOM_MPI_* settings, read and checked once, when the first group is
  // made (a malformed one is a configuration_error there, not a silent 0);
  // its sub-groups take their parent's.
  struct settings {
    // How long the progress thread (and a shared-memory wait) yield-polls
    // after the last progress before it sleeps (LOOM_MPI_YIELD_US, 2000).
    std::chrono::microseconds yield_window;
    // From this many bytes on, a collective runs as MPI's blocking call on
    // the progress thread (LOOM_MPI_BLOCKING_BYTES, 1 MiB): OpenMPI's
    // non-blocking collectives (libnbc) move large messages at a fraction
    // of its tuned blocking ones (64 MiB all-reduce: 1.4x Gloo's time
    // against ~0.5x). Its blocking calls poll; loom sets
    // mpi_yield_when_idle when it initialises MPI, so that they yield.
    long long blocking_bytes;
    // A blocking all-reduce is called on pieces of this size
    // (LOOM_MPI_PIECE_BYTES, 4 MiB).
    long long piece_bytes;
    // LOOM_MPI_SYNCHRONOUS=1: every operation completes in the calling
    // thread before the call returns, to measure what the progress
    // thread's overlap is worth.
    bool synchronous;
    // LOOM_MPI_SHARED_MEMORY=0: all-reduces go through MPI even on one node
    // (mpi_shared_memory_sum.hpp).
    bool shared_memory;
    static settings from_environment();
  };

  mpi_backend(MPI_Comm own, int rank, int size, std::chrono::milliseconds timeout, settings chosen);
  ~mpi_backend() override;

  const std::string getBackendName() const override { return "mpi"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int destination, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int source, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;

  // c10d's sequence number: the collectives issued on the group (point to
  // point excepted), which loom's tests and the DDP engine count.
  void setSequenceNumberForGroup() override { sequence_ = 0; }
  uint64_t getSequenceNumberForGroup() override { return sequence_; }

  MPI_Comm communicator() const noexcept { return comm_; }
  // Operations completed, and MPI_Test calls made (the back-off's cost).
  std::uint64_t completed() const noexcept { return completed_; }
  std::uint64_t tests() const noexcept { return tests_; }
  // All-reduces done through the node's shared memory (0 when the
  // group does not use it: see mpi_shared_memory_sum.hpp).
  bool shares_memory() const noexcept { return shared_ != nullptr; }
  std::uint64_t shared_reductions() const noexcept { return shared_ ? shared_->reductions() : 0; }

 private:
  // One queued operation: start() posts MPI's non-blocking call and returns
  // its request; finish() runs once it completed (copies, a mean's division)
  // and gives the future's value.
  class work;
  struct job {
    const char* name;
    std::function<MPI_Request()> start;
    std::function<void()> finish;
    c10::intrusive_ptr<work> done;
  };
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const char* name, std::function<MPI_Request()> start,
                                         std::function<void()> finish, std::vector<at::Tensor> outputs);
  void progress();
  // The progress thread's side of a finished operation: complete its work,
  // then hand the thread's reference to retired_.
  void complete_and_retire(c10::intrusive_ptr<work> done, std::exception_ptr error);
  // The caller's side: drop the retired works' references, so the tensors a
  // collective was given are released on a thread that issues collectives,
  // never on the progress thread (whose last release raced the caller's own
  // use of their storage: ThreadSanitizer, FSDP freeing a unit's storage).
  void release_retired();
  [[noreturn]] void fail(const char* call, int code) const;

  bool runs_blocking(const at::Tensor& tensor) const noexcept;

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::chrono::milliseconds timeout_;
  const settings settings_;
  // Used by the progress thread only, for the all-reduces it can do.
  std::unique_ptr<shared_memory_sum> shared_;
  std::mutex mutex_, synchronous_mutex_;
  std::condition_variable wake_;
  std::deque<job> queue_;
  std::vector<c10::intrusive_ptr<work>> retired_;    // guarded by mutex_
  std::vector<c10::intrusive_ptr<work>> releasing_;  // guarded by release_mutex_
  std::mutex release_mutex_;
  bool stopping_ = false;
  std::thread thread_;
  std::uint64_t completed_ = 0, tests_ = 0;
  std::atomic<std::uint64_t> sequence_{0};
};

}  // namespace loom::comm
