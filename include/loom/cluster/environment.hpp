// Cluster environments: who started this process and where its peers are,
// read from the variables each launcher sets (Lightning's ClusterEnvironment
// plugins, in Lightning's detection order). No torch headers.
#pragma once

#include <loom/environment.hpp>  // env_lookup: one way to read the environment

#include <optional>
#include <string>
#include <string_view>

namespace loom::cluster {

// What an environment says about this process.
struct cluster_info {
  std::string name;  // "slurm", "torchelastic", "kubeflow", "lsf", "mpi", "lightning"
  // Whether the processes were started by someone else (srun, torchrun,
  // mpirun, loom-run): then launch() starts nothing.
  bool creates_processes_externally = false;
  // Known from the environment; for "lightning" they are completed by the
  // strategy from devices and num_nodes (global = node * devices + local).
  std::optional<int> world_size;
  std::optional<int> global_rank;
  int local_rank = 0;
  int node_rank = 0;
  // Processes per node, when the environment says (LOCAL_WORLD_SIZE, ...).
  std::optional<int> local_world_size;
  std::string main_address = "127.0.0.1";
  int main_port = 0;  // 0: not fixed (a single-node job rendezvouses through a file)
  // loom's private rendezvous directory (set by loom-run and launch()).
  std::optional<std::string> rendezvous_dir;
};

// The variable loom-run and launch() set to their FileStore directory.
inline constexpr const char* rendezvous_dir_variable = "LOOM_RENDEZVOUS_DIR";

// Lightning's order: SLURM, TorchElastic, Kubeflow, LSF, MPI, then the
// default (loom-run / launch() / manual LOCAL_RANK) environment. Throws
// loom::configuration_error naming the variable when a value is malformed.
cluster_info detect(const env_lookup& env = process_environment());

// Each environment on its own: detect_* says whether it applies, read_*
// reads it (and validates what it reads).
bool detect_slurm(const env_lookup& env);
cluster_info read_slurm(const env_lookup& env);
bool detect_torchelastic(const env_lookup& env);
cluster_info read_torchelastic(const env_lookup& env);
bool detect_kubeflow(const env_lookup& env);
cluster_info read_kubeflow(const env_lookup& env);
bool detect_lsf(const env_lookup& env);
// hostname: this machine's name, looked up in LSB_DJOB_RANKFILE for the node rank.
cluster_info read_lsf(const env_lookup& env, const std::string& hostname);
bool detect_mpi(const env_lookup& env);
cluster_info read_mpi(const env_lookup& env);
cluster_info read_lightning(const env_lookup& env);

// SLURM_NODELIST's first host: "host[5-9]" -> "host5", "a,b" -> "a", "a b" -> "a".
std::string slurm_root_node(std::string_view nodelist);

}  // namespace loom::cluster
