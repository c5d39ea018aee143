// The inside of loom::comm::process_group, shared by loom's compiled
// sources that talk to c10d directly (the DDP engine). Not installed.
#pragma once

#include "collective_recorder.hpp"
#include "watchdog.hpp"

#include <loom/comm/process_group.hpp>
#include <loom/compat_c10d.hpp>
#include <loom/errors.hpp>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace loom::comm {

struct peer_identity {
  std::string host;
  long pid = 0;
};

// One asynchronous collective in flight: c10d's pending works and the local
// step that completes the result once they are done. Slots are pooled per
// group and keep their scratch buffers, so a warm group allocates no tensor
// storage per call.
struct work_slot {
  // Reduce the ranks' chunks (point-to-point or alltoall emulation) into out.
  struct reduction {
    at::Tensor out;
    at::Tensor own;         // this rank's chunk of the input (not sent)
    int64_t received = 0;   // index into scratch: [size, n] chunks by source rank; -1: the peer's chunk is in out
    reduce_op op = reduce_op::sum;
  };
  // Copy a wire tensor back into the caller's (bf16 reduced as float, a
  // non-contiguous input), dividing first for a mean.
  struct copy_back {
    at::Tensor target;
    at::Tensor wire;
    bool divide = false;
  };

  const char* operation = "";
  std::vector<c10::intrusive_ptr<c10d::Work>> pending;
  std::vector<reduction> reductions;
  std::vector<copy_back> copies;
  std::vector<at::Tensor> scratch;       // kept across uses, grown on demand
  at::Tensor accumulator;                // fp32 sums of bf16/fp16 chunks, kept across uses
  std::vector<at::Tensor> arguments{at::Tensor()};  // the one-tensor list c10d's API takes
  std::vector<std::vector<at::Tensor>> list_arguments{std::vector<at::Tensor>()};
  int timed_collectives = 0;  // emulated ones in flight under communication timing (traffic.hpp)
};

struct process_group_state {
  c10::intrusive_ptr<c10d::Store> root_store;  // shared by the world group and its sub-groups
  c10::intrusive_ptr<c10d::Store> store;  // this group's (prefixed) store
  c10::intrusive_ptr<compat::c10d_backend> backend;  // what collectives go through (the recorder, when watched)
  c10::intrusive_ptr<compat::c10d_backend> inner;    // the real group underneath
  std::shared_ptr<group_watch> watch;                // null: watchdog off
  c10::intrusive_ptr<c10d::ProcessGroup> native;  // made on first use
  int rank = 0;
  int size = 1;
  comm::backend kind = comm::backend::gloo;
  group_options options;
  std::vector<int> global_ranks;     // this group's ranks, as ranks of the world group
  std::vector<peer_identity> peers;  // by rank of this group
  int next_subgroup = 0;
  std::string group_name = "world";
  std::atomic<bool> is_broken{false};
  std::string broken;  // why the group is unusable; set once, before is_broken
  std::mutex broken_mutex;
  rendezvous where;
  std::uint64_t first_sequence_number = 0;
  // Collectives loom builds from point-to-point messages, which c10d's
  // sequence number does not count.
  std::atomic<std::uint64_t> emulated_collectives{0};
  std::atomic<comm::emulation> emulation{comm::emulation::point_to_point};
  std::mutex slots_mutex;
  std::vector<std::unique_ptr<work_slot>> slots;
  std::vector<work_slot*> free_slots;
};

// A collective loom builds from point-to-point messages: counted, and
// recorded for the watchdog as the collective it is. `chunk` is this rank's
// part (an all-gather's input, a reduce-scatter's output): the payload is
// the group's size of them.
// Returns whether it is timed (collective_completed() is then owed once its
// messages have arrived).
[[nodiscard]] inline bool record_emulated(process_group_state& state, collective_kind kind, const at::Tensor& chunk) {
  state.emulated_collectives.fetch_add(1, std::memory_order_relaxed);
  return state.watch && state.watch->recorder->record(kind, &chunk, all_chunks(bytes_of(chunk), state.size));
}

// Refuses a tensor that is not on the group's device (group_options::device),
// naming the collective: the device rule, checked on every machine.
void check_on_device(const process_group_state& state, const at::Tensor& tensor, const char* operation);
// Whether Gloo moves and reduces dtype natively.
bool gloo_supports(c10::ScalarType dtype);
// The tensor as the backend can take it: itself (made contiguous), or a float
// copy of a bf16 one. Refuses dtypes the backend cannot move.
at::Tensor wire_tensor(const process_group_state& state, const at::Tensor& tensor, const char* operation);

// Throws loom::peer_error when an earlier failure left the group unusable.
void check_usable(process_group_state& state, const char* operation);

// Marks the group unusable after a failed operation and returns the error
// that names the rank that went away (what every loom collective throws).
peer_error failed(process_group_state& state, const char* operation, const std::exception& error);

// The c10d ProcessGroup over this group's backend (what c10d::Reducer takes).
c10::intrusive_ptr<c10d::ProcessGroup> native_group(process_group_state& state);

}  // namespace loom::comm
