// The two places the watchdog's records meet. Not installed.
#pragma once

#include "watchdog.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <memory>
#include <optional>

namespace loom::comm {

// The process that serves a store with a server (TCPStore: global rank 0),
// and how long the watchdog waits for its answer before it counts that rank
// as stopped or gone.
struct store_host {
  int global_rank = 0;
  std::chrono::milliseconds answer_within{2000};
};

// Through the group's store (every backend with a rendezvous): records under
// the group's prefix, the verdict under the root store's, so every group of
// the job sees it. Ends a rank with _Exit: its launcher tears the job down.
// With a host, every call is answered within host->answer_within or throws
// exchange_unanswered naming the host (its calls run on a thread of their
// own, since a stopped server leaves a TCPStore client waiting).
std::unique_ptr<watchdog_exchange> store_exchange(c10::intrusive_ptr<c10d::Store> group_store,
                                                  c10::intrusive_ptr<c10d::Store> root_store, int rank,
                                                  std::optional<store_host> host);

#if defined(LOOM_WITH_MPI)
class mpi_backend;
// Through a second duplicate of the MPI group's communicator, driven by the
// watchdog thread with non-blocking point-to-point; ends the job with
// MPI_Abort. Collective over the group (MPI_Comm_dup): every member calls it.
std::unique_ptr<watchdog_exchange> mpi_exchange(const mpi_backend& group);
#endif

}  // namespace loom::comm
