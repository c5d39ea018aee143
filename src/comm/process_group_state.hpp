// The inside of loom::comm::process_group, shared by loom's compiled
// sources that talk to c10d directly (the DDP engine). Not installed.
#pragma once

#include <loom/comm/process_group.hpp>
#include <loom/compat_c10d.hpp>
#include <loom/errors.hpp>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

namespace loom::comm {

struct peer_identity {
  std::string host;
  long pid = 0;
};

struct process_group_state {
  c10::intrusive_ptr<c10d::Store> root_store;  // shared by the world group and its sub-groups
  c10::intrusive_ptr<c10d::Store> store;  // this group's (prefixed) store
  c10::intrusive_ptr<compat::c10d_backend> backend;
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
  // The one-tensor list c10d's API takes, kept so an all_reduce allocates
  // nothing of loom's own (c10d's Work objects are c10d's).
  std::vector<at::Tensor> single{at::Tensor()};
  rendezvous where;
  std::uint64_t first_sequence_number = 0;
};

// Marks the group unusable after a failed operation and returns the error
// that names the rank that went away (what every loom collective throws).
peer_error failed(process_group_state& state, const char* operation, const std::exception& error);

// The c10d ProcessGroup over this group's backend (what c10d::Reducer takes).
c10::intrusive_ptr<c10d::ProcessGroup> native_group(process_group_state& state);

}  // namespace loom::comm
