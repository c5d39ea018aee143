#include <loom/errors.hpp>
#include <loom/strategy/distributed_runtime.hpp>

#include <loom/environment.hpp>

#if defined(LOOM_WITH_MPI)
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#include <mpi.h>
#endif

#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <iostream>

namespace loom::detail {
namespace {

// The ranks of an application's communicator: world and rank its own, local
// rank and size those of its ranks on this node (MPI_COMM_TYPE_SHARED).
struct communicator_ranks {
  int rank = 0, size = 1, local_rank = 0, local_size = 1;
};
communicator_ranks ranks_of(std::int64_t handle) {
#if defined(LOOM_WITH_MPI)
  int initialised = 0;
  MPI_Initialized(&initialised);
  if (!initialised) {
    throw configuration_error("mpi_communicator is set, but MPI is not initialised: the application initialises "
                              "MPI (MPI_Init_thread with MPI_THREAD_MULTIPLE) and passes MPI_Comm_c2f(its "
                              "communicator)");
  }
  const MPI_Comm comm = MPI_Comm_f2c(static_cast<MPI_Fint>(handle));
  communicator_ranks out;
  MPI_Comm_rank(comm, &out.rank);
  MPI_Comm_size(comm, &out.size);
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, out.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &out.local_rank);
  MPI_Comm_size(local, &out.local_size);
  MPI_Comm_free(&local);
  return out;
#else
  (void)handle;
  throw configuration_error("mpi_communicator is set, but this loom was built without MPI (the `mpi` Meson "
                            "feature needs libopenmpi-dev)");
#endif
}

bool is_loopback(const std::string& address) {
  return address.rfind("127.", 0) == 0 || address == "localhost" || address == "::1";
}

}  // namespace

distributed_runtime::distributed_runtime(const strategy_environment& environment, parallel_options options)
    : environment_(environment), launcher_(options.launcher), options_(options), cluster_(cluster::detect()) {
  const auto& requested = environment.requested;
  num_nodes_ = environment.num_nodes;
  if (options.mpi_communicator) {
    // The application's communicator decides the ranks (a split trains on its own).
    if (options.backend != comm::backend::mpi) {
      throw configuration_error("mpi_communicator is set, so process_group_backend must be mpi (the group runs on "
                                "that communicator)");
    }
    const communicator_ranks ranks = ranks_of(*options.mpi_communicator);
    cluster_.creates_processes_externally = true;
    world_size_ = ranks.size;
    global_rank_ = ranks.rank;
    local_rank_ = ranks.local_rank;
    local_world_size_ = ranks.local_size;
    num_nodes_ = std::max(1, ranks.size / std::max(1, ranks.local_size));
    node_rank_ = ranks.rank / std::max(1, ranks.local_size);
  } else if (cluster_.creates_processes_externally) {
    node_rank_ = cluster_.node_rank;
    local_rank_ = cluster_.local_rank;
    if (cluster_.name == "lightning") {
      if (!cluster_.world_size) {
        throw configuration_error(
            "LOCAL_RANK is set but WORLD_SIZE is not: a process started by hand needs both (and NODE_RANK, "
            "MASTER_ADDR, MASTER_PORT for several nodes). Start the program with loom-run instead.");
      }
      world_size_ = *cluster_.world_size;
      if (auto nodes = cluster::setting_integer("LT_NUM_NODES", 1, 1 << 20)) num_nodes_ = static_cast<int>(*nodes);
    } else {
      world_size_ = *cluster_.world_size;
    }
    // Processes per node: as asked, else as the launcher says, else spread evenly.
    if (requested.given()) {
      local_world_size_ = environment.parse_devices(requested).count();
    } else if (cluster_.local_world_size) {
      local_world_size_ = *cluster_.local_world_size;
    } else if (const auto cli = cluster::setting_text("LT_DEVICES")) {
      local_world_size_ = environment.parse_devices(devices_spec(*cli)).count();
    } else {
      local_world_size_ = std::max(1, world_size_ / std::max(1, num_nodes_));
    }
    if (cluster_.name == "lightning" || cluster_.name == "torchelastic") {
      if (local_world_size_ * num_nodes_ != world_size_) {
        throw configuration_error("devices=" + std::to_string(local_world_size_) + " and num_nodes=" +
                                  std::to_string(num_nodes_) + " make " + std::to_string(local_world_size_ * num_nodes_) +
                                  " processes, but the " + cluster_.name + " environment started " +
                                  std::to_string(world_size_) + " (WORLD_SIZE). Make them agree.");
      }
    }
    global_rank_ = cluster_.global_rank ? *cluster_.global_rank : node_rank_ * local_world_size_ + local_rank_;
    num_nodes_ = std::max(1, world_size_ / std::max(1, local_world_size_));
  } else {
    local_world_size_ = environment.parse_devices(requested).count();
    node_rank_ = cluster_.node_rank;
    world_size_ = local_world_size_ * num_nodes_;
    global_rank_ = node_rank_ * local_world_size_;
    if (node_rank_ >= num_nodes_) {
      throw configuration_error("NODE_RANK=" + std::to_string(node_rank_) + " is not below num_nodes=" +
                                std::to_string(num_nodes_));
    }
  }
  selection_ = environment.parse_devices(devices_spec(local_world_size_));
  if (local_rank_ >= selection_.count()) {
    throw configuration_error("local rank " + std::to_string(local_rank_) + " has no device: " +
                              std::to_string(selection_.count()) + " device(s) per node");
  }
  device_ = environment.device_of(selection_, local_rank_);
}

void distributed_runtime::export_rank_variables(int local_rank) const {
  using cluster::export_variable;
  export_variable("LOCAL_RANK", std::to_string(local_rank));
  export_variable("NODE_RANK", std::to_string(node_rank_));
  export_variable("WORLD_SIZE", std::to_string(world_size_));
  export_variable("MASTER_ADDR", cluster_.main_address);
  if (cluster_.main_port != 0) export_variable("MASTER_PORT", std::to_string(cluster_.main_port));
  if (!rendezvous_dir_.empty()) export_variable(cluster::rendezvous_dir_variable, rendezvous_dir_);
  export_variable("LT_DEVICES", std::to_string(local_world_size_));
  export_variable("LT_NUM_NODES", std::to_string(num_nodes_));
}

void distributed_runtime::start_subprocesses() {
  if (num_nodes_ == 1) rendezvous_dir_ = launch::make_private_directory();
  export_rank_variables(0);
  std::vector<std::string> argv = launch::own_command_line();
  if (argv.empty()) throw std::runtime_error("launch: cannot read this program's command line");
  argv[0] = launch::own_executable();
  supervisor_ = std::make_unique<launch::supervisor>();
  for (int rank = 1; rank < local_world_size_; ++rank) {
    supervisor_->start(rank, argv, {{"LOCAL_RANK", std::to_string(rank)}});
  }
  cluster_.creates_processes_externally = true;
  cluster_.rendezvous_dir = rendezvous_dir_.empty() ? std::nullopt : std::optional<std::string>(rendezvous_dir_);
  start_monitor();
}

void distributed_runtime::fork_children() {
  if (num_nodes_ == 1) rendezvous_dir_ = launch::make_private_directory();
  supervisor_ = std::make_unique<launch::supervisor>();
  const pid_t parent = ::getpid();
  for (int rank = 1; rank < local_world_size_; ++rank) {
    std::fflush(nullptr);
    const pid_t pid = ::fork();
    if (pid < 0) throw std::runtime_error("launch: fork failed");
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) std::_Exit(1);
      forked_child_ = true;
      (void)supervisor_.release();  // the siblings are the parent's to watch
      local_rank_ = rank;
      global_rank_ = node_rank_ * local_world_size_ + rank;
      device_ = environment_.device_of(selection_, rank);
      export_rank_variables(rank);
      if (!rendezvous_dir_.empty()) cluster_.rendezvous_dir = rendezvous_dir_;
      rendezvous_dir_.clear();  // the parent removes it
      cluster_.creates_processes_externally = true;
      return;
    }
    supervisor_->adopt(rank, pid);
  }
  export_rank_variables(0);
  cluster_.creates_processes_externally = true;
  start_monitor();
}

void distributed_runtime::start_monitor() {
  if (!supervisor_ || supervisor_->children().empty()) return;
  monitor_ = std::thread([this] {
    const launch::job_outcome outcome = supervisor_->wait_all();
    if (outcome.failed_rank) {
      // A local rank failed: the others were ended; this process (rank 0) ends
      // with the failing rank's status, so the job as a whole fails.
      std::fflush(stdout);
      std::fprintf(stderr, "loom: %s; the other ranks were ended\n", outcome.description.c_str());
      std::fflush(stderr);
      if (!rendezvous_dir_.empty()) launch::remove_directory(rendezvous_dir_);
      std::_Exit(outcome.exit_code == 0 ? 1 : outcome.exit_code);
    }
  });
}

void distributed_runtime::launch() {
  if (launched_) return;
  if (!cluster_.creates_processes_externally && local_world_size_ > 1) {
    if (launcher_ == launcher_kind::fork) {
      fork_children();
    } else {
      start_subprocesses();
    }
  }
  launched_ = true;
  connect();
}

void distributed_runtime::connect() {
  if (world_size_ == 1) return;  // one process: collectives are identities
  comm::rendezvous where;
  const std::string dir = !rendezvous_dir_.empty() ? rendezvous_dir_ : cluster_.rendezvous_dir.value_or("");
  if (options_.backend == comm::backend::mpi) {
    // The MPI group meets through MPI: no address, no port.
  } else if (!dir.empty() && num_nodes_ == 1) {
    where.file_path = dir + "/store";
  } else {
    where.address = cluster_.main_address;
    where.port = cluster_.main_port;
    if (where.port == 0) {
      throw configuration_error(
          "no rendezvous for " + std::to_string(world_size_) + " processes: set MASTER_ADDR and MASTER_PORT (the "
          "address and a free port of node 0), or start the program with loom-run.");
    }
  }
  comm::group_options group_options;
  group_options.timeout = options_.timeout;
  group_options.kind = options_.backend;
  group_options.mpi_communicator = options_.mpi_communicator;
  group_options.collective_timeout = options_.collective_timeout;
  group_options.loopback_only = num_nodes_ == 1 || is_loopback(cluster_.main_address);
  group_options.device = device_;
  group_ = comm::process_group::connect(where, global_rank_, world_size_, group_options);
}

comm::process_group& distributed_runtime::group() {
  if (!launched_) {
    if (!cluster_.creates_processes_externally && local_world_size_ > 1) {
      throw configuration_error("this strategy runs " + std::to_string(local_world_size_) +
                                " processes per node: call fabric.launch() first (or start the program with "
                                "loom-run, torchrun, srun or mpirun)");
    }
    launch();
  }
  return group_;
}

distributed_runtime::~distributed_runtime() {
  if (monitor_.joinable()) monitor_.join();
  group_ = comm::process_group();
  if (!rendezvous_dir_.empty()) launch::remove_directory(rendezvous_dir_);
}

}  // namespace loom::detail
