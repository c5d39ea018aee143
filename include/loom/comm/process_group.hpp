// A process group over LibTorch's c10d (Gloo on CPU, NCCL behind the `nccl`
// build option), with loom's rendezvous rules, timeouts on every wait, and
// failures turned into loom::peer_error naming the rank that went away.
// The c10d headers stay in src/: this header needs only ATen.
#pragma once

#include <loom/comm/capabilities.hpp>
#include <loom/comm/reduce_op.hpp>
#include <loom/comm/work.hpp>

#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>
#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace loom::comm {

// Where the ranks meet. A file store (in a private directory) when file_path
// is set: nothing listens on the network. Else c10d's TCPStore at
// address:port, hosted by rank 0.
struct rendezvous {
  std::optional<std::string> file_path;
  std::string address = "127.0.0.1";
  int port = 0;
};

struct group_options {
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // torch's default
  backend kind = backend::gloo;
  // Gloo's sockets on 127.0.0.1 (single-node jobs). GLOO_SOCKET_IFNAME, when
  // set, names the interface instead, as in torch.
  bool loopback_only = true;
  // How reduce_scatter_into / all_gather_into run where the backend has no
  // native form (Gloo).
  comm::emulation emulation = comm::emulation::point_to_point;
  // backend mpi: the communicator to duplicate (MPI_Comm_c2f's handle);
  // empty: MPI_COMM_WORLD.
  std::optional<std::int64_t> mpi_communicator;
  // The watchdog: a rank that has waited this long in a collective that some
  // rank has not entered ends the job with a message naming that rank (or
  // both ops, when ranks entered different collectives). Far below timeout,
  // which bounds every wait regardless. 0 turns it off; the environment
  // variable LOOM_COLLECTIVE_TIMEOUT (seconds) overrides it.
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(300);
  // Where every tensor this group's collectives send must live: the CPU, or
  // cuda:LOCAL_RANK for the ranks of a GPU job (NCCL refuses CPU tensors;
  // Gloo carries either, as Lightning allows). Each collective checks each
  // tensor against it, so a scalar built on the wrong device fails on any
  // machine, not only on the GPU one. Sub-groups inherit it.
  c10::Device device = c10::Device(c10::DeviceType::CPU);
};

// While one lives, this process's collective watchdog raises no alarm: for
// loom's phases in which one rank works alone while the others wait (a full
// save, consolidation); they use the group's own timeout. Nests.
class watchdog_pause {
 public:
  watchdog_pause();
  ~watchdog_pause();
  watchdog_pause(const watchdog_pause&) = delete;
  watchdog_pause& operator=(const watchdog_pause&) = delete;
};

struct process_group_state;

class process_group {
 public:
  process_group() = default;  // no group: size 1, rank 0, valid() false

  // Collective over all world_size ranks. Throws loom::peer_error when the
  // rendezvous fails (port in use, address unreachable, timeout).
  static process_group connect(const rendezvous& where, int rank, int world_size, const group_options& options);

  bool valid() const noexcept { return state_ != nullptr; }
  int rank() const noexcept;
  int size() const noexcept;
  backend kind() const noexcept;
  std::chrono::milliseconds timeout() const noexcept;
  // group_options::device: build the tensors a collective sends there.
  c10::Device device() const noexcept;

  // In place. mean: sum, then division (floating tensors only).
  void all_reduce(at::Tensor& tensor, reduce_op op = reduce_op::sum);
  void broadcast(at::Tensor& tensor, int source = 0);
  // One tensor per rank; shapes may differ across ranks (dtypes may not).
  std::vector<at::Tensor> all_gather_per_rank(const at::Tensor& tensor);
  // [world_size, ...]: every rank's tensor must have the same shape.
  at::Tensor all_gather_stacked(const at::Tensor& tensor);
  // input's first dimension is world_size * n; returns this rank's n rows of
  // the reduction. Gloo: all_reduce then narrow; NCCL: native.
  at::Tensor reduce_scatter(const at::Tensor& input, reduce_op op = reduce_op::sum);
  void barrier();

  // ---- Fixed-shape collectives for sharding: the caller owns both buffers
  // (contiguous, same dtype), nothing is exchanged about shapes, and no
  // tensor is allocated per call once the group is warm (release_buffers
  // gives back what the emulations keep). Every rank issues
  // one group's collectives in the same program order; handles on different
  // groups may be waited in any order.
  //
  // out holds size() * in.numel() elements: rank k's input lands in its k-th
  // chunk. `in` may be out's own chunk (in-place gather).
  work all_gather_into(const at::Tensor& out, const at::Tensor& in);
  // in holds size() * out.numel() elements; out gets the reduction over the
  // ranks of every rank's chunk rank(), summed in rank order (bf16 and fp16
  // accumulate in fp32 and round once). out may be in's own chunk.
  work reduce_scatter_into(const at::Tensor& out, const at::Tensor& in, reduce_op op = reduce_op::sum);
  // Several buffers under one handle (outs[i] with ins[i], as above).
  work all_gather_into(std::span<const at::Tensor> outs, std::span<const at::Tensor> ins);
  work reduce_scatter_into(std::span<const at::Tensor> outs, std::span<const at::Tensor> ins,
                           reduce_op op = reduce_op::sum);
  // Drops the receive buffers the emulated reduce-scatter keeps between calls
  // (on more than two ranks, or for 16-bit floats, one as large as its
  // input; two ranks of fp32 need none): a sharding engine calls it after
  // each backward so that what it holds between steps is only its shards.
  void release_buffers();
  // all_reduce and broadcast in place, asynchronously.
  work all_reduce_async(const at::Tensor& tensor, reduce_op op = reduce_op::sum);
  work broadcast_async(const at::Tensor& tensor, int source = 0);

  // What the backend has natively (and so what loom emulates).
  backend_capabilities capabilities() const noexcept { return capabilities_of(kind()); }
  // The emulation used where the backend lacks a collective (benchmarks switch it).
  comm::emulation emulation() const noexcept;
  void set_emulation(comm::emulation choice);

  // Any IValue (numbers, strings, lists, dicts, tensors) from source to all,
  // through LibTorch's pickler.
  c10::IValue broadcast_object(const c10::IValue& value, int source = 0);

  // Collectives this process has issued on the group since it formed
  // (c10d's sequence number): what tests count.
  std::uint64_t collectives_issued() const;
  // What the watchdog recorded: the collectives entered on this group
  // (through loom, DDP's Reducer or the sharding engine), and the last
  // `count` of them described ("all_reduce(float[1024])"), oldest first.
  // 0 and empty when the watchdog is off.
  std::uint64_t collectives_recorded() const;
  std::vector<std::string> recent_collectives(std::size_t count) const;

  // A sub-group of `ranks` (global ranks of this group). Every rank of this
  // group must call it, in the same order; non-members get an invalid group.
  process_group new_group(const std::vector<int>& ranks) const;

  // For engines that talk to c10d directly (DDP's reducer): the c10d group.
  const std::shared_ptr<process_group_state>& state() const noexcept { return state_; }
  // A handle on an existing group's state.
  static process_group attach(std::shared_ptr<process_group_state> state) { return process_group(std::move(state)); }

 private:
  explicit process_group(std::shared_ptr<process_group_state> state) : state_(std::move(state)) {}
  std::shared_ptr<process_group_state> state_;
};

// A mean is a sum divided by the group size: floating tensors only (a
// configuration_error otherwise, before anything is sent).
void check_mean_dtype(const at::Tensor& tensor, reduce_op op);

// A TCP port that was free a moment ago on 127.0.0.1 (for tests and launchers).
int find_free_port();

}  // namespace loom::comm
