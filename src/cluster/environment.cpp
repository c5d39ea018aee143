// The cluster environments, with Lightning's variable names and rules
// (lightning/fabric/plugins/environments/). MPI is read from the variables
// the MPI launchers set, with no MPI library.
#include <loom/cluster/environment.hpp>
#include <loom/errors.hpp>


#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <vector>

namespace loom::cluster {

namespace {

bool has(const env_lookup& env, std::string_view name) { return env(name).has_value(); }

std::int64_t parse_integer(std::string_view name, const std::string& text, std::string_view environment) {
  // Schedulers pad some values with spaces ("  2"): leading ones are allowed.
  const auto first = text.find_first_not_of(' ');
  const auto value = first == std::string::npos ? std::nullopt : whole_number(std::string_view(text).substr(first));
  if (!value) {
    throw configuration_error(std::string(name) + "='" + text + "' is not an integer (read by loom's " +
                              std::string(environment) + " environment)");
  }
  return *value;
}

int required_int(const env_lookup& env, std::string_view name, std::string_view environment) {
  auto text = env(name);
  if (!text) {
    throw configuration_error(std::string(name) + " is not set, but the " + std::string(environment) +
                              " environment needs it");
  }
  return static_cast<int>(parse_integer(name, *text, environment));
}

std::optional<int> optional_int(const env_lookup& env, std::string_view name, std::string_view environment) {
  auto text = env(name);
  if (!text) return std::nullopt;
  return static_cast<int>(parse_integer(name, *text, environment));
}

int port_value(const env_lookup& env, std::string_view name, std::string_view environment) {
  const int port = required_int(env, name, environment);
  if (port < 1 || port > 65535) {
    throw configuration_error(std::string(name) + "=" + std::to_string(port) + " is not a TCP port (1 to 65535)");
  }
  return port;
}

// Ranks must fit the world; a mistake here would hang the rendezvous.
void check_ranks(const cluster_info& info, std::string_view world_var, std::string_view rank_var,
                 std::string_view local_var) {
  if (info.world_size && *info.world_size < 1) {
    throw configuration_error(std::string(world_var) + "=" + std::to_string(*info.world_size) +
                              " is not a world size (it must be >= 1)");
  }
  if (info.global_rank && (*info.global_rank < 0 || (info.world_size && *info.global_rank >= *info.world_size))) {
    throw configuration_error(std::string(rank_var) + "=" + std::to_string(*info.global_rank) + " is not a rank of a world of " +
                              std::to_string(info.world_size.value_or(0)) + " (" + std::string(world_var) + ")");
  }
  if (info.local_rank < 0) {
    throw configuration_error(std::string(local_var) + "=" + std::to_string(info.local_rank) + " is negative");
  }
  if (info.node_rank < 0) throw configuration_error("the node rank " + std::to_string(info.node_rank) + " is negative");
}

}  // namespace

// ----------------------------------------------------------------- SLURM
std::string slurm_root_node(std::string_view nodelist) {
  std::string nodes(nodelist);
  // The first node of every range, then single-number ranges, as Lightning.
  nodes = std::regex_replace(nodes, std::regex(R"(\[(.*?)[,-].*\])"), "$1");
  nodes = std::regex_replace(nodes, std::regex(R"(\[(.*?)\])"), "$1");
  nodes = nodes.substr(0, nodes.find(' '));
  return nodes.substr(0, nodes.find(','));
}

bool detect_slurm(const env_lookup& env) {
  // `srun --job-name=bash|interactive` sessions are left to the other environments.
  const auto job_name = env("SLURM_JOB_NAME");
  const bool interactive = job_name && (*job_name == "bash" || *job_name == "interactive");
  return has(env, "SLURM_NTASKS") && !interactive;
}

cluster_info read_slurm(const env_lookup& env) {
  constexpr std::string_view name = "slurm";
  cluster_info info;
  info.name = std::string(name);
  info.creates_processes_externally = true;
  info.world_size = required_int(env, "SLURM_NTASKS", name);
  if (*info.world_size > 1 && !has(env, "SLURM_NTASKS_PER_NODE")) {
    throw configuration_error("SLURM_NTASKS=" + std::to_string(*info.world_size) +
                              " is set without SLURM_NTASKS_PER_NODE: use --ntasks-per-node=" +
                              std::to_string(*info.world_size) + " instead of --ntasks in the SLURM script");
  }
  info.global_rank = required_int(env, "SLURM_PROCID", name);
  info.local_rank = required_int(env, "SLURM_LOCALID", name);
  info.node_rank = required_int(env, "SLURM_NODEID", name);
  if (auto per_node = env("SLURM_NTASKS_PER_NODE")) {
    // "2" or "2(x3)": the count before any repetition suffix.
    info.local_world_size =
        static_cast<int>(parse_integer("SLURM_NTASKS_PER_NODE", per_node->substr(0, per_node->find('(')), name));
  }
  info.main_address = slurm_root_node(env("SLURM_NODELIST").value_or("127.0.0.1"));
  if (has(env, "MASTER_PORT")) {
    info.main_port = port_value(env, "MASTER_PORT", name);
  } else if (auto job_id = env("SLURM_JOB_ID")) {
    // The last four digits of the job id, in the 15000+ range: every task computes the same port.
    parse_integer("SLURM_JOB_ID", *job_id, name);
    const std::string tail = job_id->size() > 4 ? job_id->substr(job_id->size() - 4) : *job_id;
    info.main_port = static_cast<int>(parse_integer("SLURM_JOB_ID", tail, name)) + 15000;
  } else {
    info.main_port = 12910;
  }
  check_ranks(info, "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID");
  return info;
}

// ---------------------------------------------------------- TorchElastic
bool detect_torchelastic(const env_lookup& env) { return has(env, "TORCHELASTIC_RUN_ID"); }

cluster_info read_torchelastic(const env_lookup& env) {
  constexpr std::string_view name = "torchelastic";
  cluster_info info;
  info.name = std::string(name);
  info.creates_processes_externally = true;
  info.world_size = required_int(env, "WORLD_SIZE", name);
  info.global_rank = required_int(env, "RANK", name);
  info.local_rank = required_int(env, "LOCAL_RANK", name);
  info.node_rank = optional_int(env, "GROUP_RANK", name).value_or(0);
  info.local_world_size = optional_int(env, "LOCAL_WORLD_SIZE", name);
  info.main_address = env("MASTER_ADDR").value_or("127.0.0.1");
  info.main_port = has(env, "MASTER_PORT") ? port_value(env, "MASTER_PORT", name) : 12910;
  check_ranks(info, "WORLD_SIZE", "RANK", "LOCAL_RANK");
  return info;
}

// -------------------------------------------------------------- Kubeflow
bool detect_kubeflow(const env_lookup& env) {
  for (const char* required : {"KUBERNETES_PORT", "MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK"}) {
    if (!has(env, required)) return false;
  }
  // torchelastic sets these; a PyTorchJob does not.
  for (const char* excluded : {"GROUP_RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) {
    if (has(env, excluded)) return false;
  }
  return true;
}

cluster_info read_kubeflow(const env_lookup& env) {
  constexpr std::string_view name = "kubeflow";
  cluster_info info;
  info.name = std::string(name);
  info.creates_processes_externally = true;
  info.world_size = required_int(env, "WORLD_SIZE", name);
  info.global_rank = required_int(env, "RANK", name);
  info.local_rank = 0;  // one process per pod
  info.local_world_size = 1;
  info.node_rank = *info.global_rank;
  info.main_address = *env("MASTER_ADDR");
  info.main_port = port_value(env, "MASTER_PORT", name);
  check_ranks(info, "WORLD_SIZE", "RANK", "LOCAL_RANK");
  return info;
}

// ------------------------------------------------------------------- LSF
bool detect_lsf(const env_lookup& env) {
  for (const char* required : {"LSB_JOBID", "LSB_DJOB_RANKFILE", "JSM_NAMESPACE_LOCAL_RANK", "JSM_NAMESPACE_SIZE"}) {
    if (!has(env, required)) return false;
  }
  return true;
}

cluster_info read_lsf(const env_lookup& env, const std::string& hostname) {
  constexpr std::string_view name = "lsf";
  cluster_info info;
  info.name = std::string(name);
  info.creates_processes_externally = true;
  info.world_size = required_int(env, "JSM_NAMESPACE_SIZE", name);
  info.global_rank = required_int(env, "JSM_NAMESPACE_RANK", name);
  info.local_rank = required_int(env, "JSM_NAMESPACE_LOCAL_RANK", name);

  const std::string rankfile = env("LSB_DJOB_RANKFILE").value_or("");
  if (rankfile.empty()) throw configuration_error("LSB_DJOB_RANKFILE is empty; the lsf environment reads hosts from it");
  std::ifstream in(rankfile);
  if (!in) throw configuration_error("LSB_DJOB_RANKFILE=" + rankfile + " cannot be opened");
  std::vector<std::string> hosts;
  for (std::string line; std::getline(in, line);) {
    line.erase(0, line.find_first_not_of(" \t\r"));
    line.erase(line.find_last_not_of(" \t\r") + 1);
    hosts.push_back(line);
  }
  if (hosts.size() < 2) {
    throw configuration_error("LSB_DJOB_RANKFILE=" + rankfile + " lists no compute host after the launch node");
  }
  hosts.erase(hosts.begin());  // the first line is the launch node
  info.main_address = hosts.front();
  std::vector<std::string> unique;
  for (const auto& host : hosts) {
    if (std::find(unique.begin(), unique.end(), host) == unique.end()) unique.push_back(host);
  }
  auto it = std::find(unique.begin(), unique.end(), hostname);
  if (it == unique.end()) {
    throw configuration_error("this host (" + hostname + ") is not in LSB_DJOB_RANKFILE=" + rankfile);
  }
  info.node_rank = static_cast<int>(it - unique.begin());
  if (has(env, "MASTER_PORT")) {
    info.main_port = port_value(env, "MASTER_PORT", name);
  } else {
    info.main_port = static_cast<int>(parse_integer("LSB_JOBID", *env("LSB_JOBID"), name) % 1000 + 10000);
  }
  check_ranks(info, "JSM_NAMESPACE_SIZE", "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK");
  return info;
}

// ------------------------------------------------------------------- MPI
namespace {
struct mpi_names {
  const char* size;
  const char* rank;
  const char* local_rank;
  const char* local_size;
  const char* job_id;
};
// OpenMPI, then MPICH (hydra) and Intel MPI.
constexpr mpi_names openmpi{"OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK",
                            "OMPI_COMM_WORLD_LOCAL_SIZE", "OMPI_MCA_ess_base_jobid"};
constexpr mpi_names pmi{"PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_JOBID"};

const mpi_names* mpi_flavour(const env_lookup& env) {
  if (has(env, openmpi.size)) return &openmpi;
  if (has(env, pmi.size)) return &pmi;
  return nullptr;
}
}  // namespace

bool detect_mpi(const env_lookup& env) {
  // As Lightning: an MPI job of more than one process.
  const mpi_names* names = mpi_flavour(env);
  if (names == nullptr) return false;
  const auto size = env(names->size);
  const auto value = whole_number(*size);
  return !value || *value > 1;  // a malformed size is reported by read_mpi
}

cluster_info read_mpi(const env_lookup& env) {
  constexpr std::string_view name = "mpi";
  const mpi_names* names = mpi_flavour(env);
  if (names == nullptr) throw configuration_error("neither OMPI_COMM_WORLD_SIZE nor PMI_SIZE is set");
  cluster_info info;
  info.name = std::string(name);
  info.creates_processes_externally = true;
  info.world_size = required_int(env, names->size, name);
  info.global_rank = required_int(env, names->rank, name);
  info.local_rank = required_int(env, names->local_rank, name);
  const int local_size = required_int(env, names->local_size, name);
  if (local_size < 1) {
    throw configuration_error(std::string(names->local_size) + "=" + std::to_string(local_size) + " must be >= 1");
  }
  // mpirun's default mapping fills a node before the next (by slot).
  info.node_rank = *info.global_rank / local_size;
  info.local_world_size = local_size;
  info.main_address = env("MASTER_ADDR").value_or("127.0.0.1");
  if (has(env, "MASTER_PORT")) {
    info.main_port = port_value(env, "MASTER_PORT", name);
  } else if (auto job = env(names->job_id)) {
    // Every rank of one mpirun job computes the same port; two jobs rarely collide.
    info.main_port = static_cast<int>(parse_integer(names->job_id, *job, name) % 20000 + 20000);
  } else {
    info.main_port = 12910;
  }
  check_ranks(info, names->size, names->rank, names->local_rank);
  return info;
}

// ------------------------------------------------------------- Lightning
cluster_info read_lightning(const env_lookup& env) {
  constexpr std::string_view name = "lightning";
  cluster_info info;
  info.name = std::string(name);
  // With LOCAL_RANK set, someone else (loom-run, or the user) started the processes.
  info.creates_processes_externally = has(env, "LOCAL_RANK");
  info.local_rank = optional_int(env, "LOCAL_RANK", name).value_or(0);
  const int group_rank = optional_int(env, "GROUP_RANK", name).value_or(0);
  info.node_rank = optional_int(env, "NODE_RANK", name).value_or(group_rank);
  info.world_size = optional_int(env, "WORLD_SIZE", name);
  info.local_world_size = optional_int(env, "LOCAL_WORLD_SIZE", name);
  info.main_address = env("MASTER_ADDR").value_or("127.0.0.1");
  info.main_port = has(env, "MASTER_PORT") ? port_value(env, "MASTER_PORT", name) : 0;
  if (auto dir = env(rendezvous_dir_variable); dir && !dir->empty()) info.rendezvous_dir = *dir;
  check_ranks(info, "WORLD_SIZE", "RANK", "LOCAL_RANK");
  return info;
}

cluster_info detect(const env_lookup& env) {
  if (detect_slurm(env)) return read_slurm(env);
  if (detect_torchelastic(env)) return read_torchelastic(env);
  if (detect_kubeflow(env)) return read_kubeflow(env);
  if (detect_lsf(env)) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    return read_lsf(env, host);
  }
  if (detect_mpi(env)) return read_mpi(env);
  return read_lightning(env);
}

}  // namespace loom::cluster
