// The options of the processes a distributed strategy runs on, written once:
// every distributed strategy's options hold them as `process`
// (ddp_options::process, fsdp_options::process, deepspeed_options::process,
// model_parallel_options::process), and they are the whole of
// loom::parallel's (parallel_options). Lightning passes them as the same
// keyword arguments to each strategy; the run-time registry reads them under
// those names (timeout, process_group_backend, collective_timeout).
#pragma once

#include <loom/comm/capabilities.hpp>
#include <loom/launch/launcher_kind.hpp>

#include <chrono>
#include <cstdint>
#include <optional>

namespace loom {

struct process_options {
  std::chrono::milliseconds timeout = std::chrono::minutes(30);  // every wait, as torch's default
  comm::backend backend = comm::backend::gloo;                   // Lightning: process_group_backend
  launcher_kind launcher = launcher_kind::subprocess;            // how launch() starts the local ranks
  // backend mpi: the application's communicator, as MPI_Comm_c2f(comm) gives
  // it, whose ranks the Fabric takes (a split trains on its own); empty:
  // MPI_COMM_WORLD and the launcher's ranks.
  std::optional<std::int64_t> mpi_communicator;
  // The watchdog's limit on waiting for a rank that has not entered a
  // collective (comm::group_options::collective_timeout); 0: off.
  std::chrono::milliseconds collective_timeout = std::chrono::seconds(300);

  bool operator==(const process_options&) const = default;
};

// loom::parallel (Lightning's ParallelStrategy) takes nothing else.
using parallel_options = process_options;

}  // namespace loom
