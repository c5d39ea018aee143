// The two places the watchdog's records meet. Not installed.
#pragma once

#include "watchdog.hpp"

#include <torch/csrc/distributed/c10d/Store.hpp>

#include <memory>

namespace loom::comm {

// Through the group's store (every backend with a rendezvous): records under
// the group's prefix, the verdict under the root store's, so every group of
// the job sees it. Ends a rank with _Exit: its launcher tears the job down.
std::unique_ptr<watchdog_exchange> store_exchange(c10::intrusive_ptr<c10d::Store> group_store,
                                                  c10::intrusive_ptr<c10d::Store> root_store, int rank);

#if defined(LOOM_WITH_MPI)
class mpi_backend;
// Through a second duplicate of the MPI group's communicator, driven by the
// watchdog thread with non-blocking point-to-point; ends the job with
// MPI_Abort. Collective over the group (MPI_Comm_dup): every member calls it.
std::unique_ptr<watchdog_exchange> mpi_exchange(const mpi_backend& group);
#endif

}  // namespace loom::comm
