// loom-run: Lightning's `fabric run` for C++ programs. Starts --devices
// processes of PROGRAM on this node with the rank variables set, watches them,
// and ends the whole job when one fails. Needs no torch headers.
//
//   loom-run --accelerator cpu --strategy parallel --devices 2 build/examples/fashion_mnist --epochs 1
#include <loom/accelerator/parse_devices.hpp>
#include <loom/runtime/connector.hpp>
#include <loom/cluster/environment.hpp>
#include <loom/errors.hpp>
#include <loom/launch/supervisor.hpp>
#include <loom/runtime/names.hpp>

#include <CLI/CLI.hpp>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <string>
#include <vector>

namespace {

struct arguments {
  std::string accelerator;
  std::string strategy;
  std::string devices = "1";
  int num_nodes = 1;
  int node_rank = 0;
  std::string main_address = "127.0.0.1";
  int main_port = 29400;
  std::string precision;
  std::vector<std::string> command;
};

// Visible NVIDIA devices, read without CUDA: /proc/driver/nvidia/gpus, then CUDA_VISIBLE_DEVICES.
int visible_cuda_devices() {
  int count = 0;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/driver/nvidia/gpus", ec)) {
    (void)entry;
    ++count;
  }
  if (const auto visible = loom::cluster::process_environment()("CUDA_VISIBLE_DEVICES")) {
    const std::string& text = *visible;
    int listed = text.empty() ? 0 : 1;
    for (char c : text) listed += c == ',' ? 1 : 0;
    count = std::min(count, listed);
  }
  return count;
}

// The flags through the same connector make_fabric uses (Lightning's rules),
// before anything starts: how many processes this node runs.
int processes_per_node(const arguments& args) {
  loom::runtime::connector_input input;
  input.accelerator = args.accelerator.empty() ? "auto" : args.accelerator;
  input.strategy = args.strategy.empty() ? "auto" : args.strategy;
  input.devices = loom::devices_spec(args.devices);
  if (!args.precision.empty()) input.precision = args.precision;
  input.num_nodes = args.num_nodes;
  // loom-run links no CUDA: a visible NVIDIA device counts as usable; the
  // program itself says so if its LibTorch has no CUDA.
  const int cuda = visible_cuda_devices();
  const auto machine = loom::runtime::builtin_machine(cuda, cuda > 0);
  const auto chosen = loom::runtime::connect(input, machine, loom::cluster::recorded_environment({}));
  for (const auto& warning : chosen.warnings) std::cerr << "loom-run: warning: " << warning << '\n';
  return chosen.processes_per_node;
}

// Children of this process, for the signal handler (set before any signal is forwarded).
constexpr int max_children = 4096;
pid_t child_pids[max_children];
volatile sig_atomic_t child_count = 0;

void forward_signal(int signal) {
  for (int i = 0; i < child_count; ++i) ::kill(-child_pids[i], signal);  // each rank leads its process group
}

}  // namespace

// A tool installed beside loom-run (loom-consolidate, loom-bench).
std::filesystem::path sibling_tool(const char* name, const char* argv0) {
  std::error_code ec;
  const auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  return (ec ? std::filesystem::path(argv0).parent_path() : self.parent_path()) / name;
}

// `loom-run consolidate DIR [OUT]`: loom-run stays torch-free, so the work is
// done by loom-consolidate, installed beside it.
int consolidate(int argc, char** argv) {
  const auto tool = sibling_tool("loom-consolidate", argv[0]);
  std::vector<char*> command{const_cast<char*>(tool.c_str())};
  for (int i = 2; i < argc; ++i) command.push_back(argv[i]);
  command.push_back(nullptr);
  ::execv(tool.c_str(), command.data());
  std::cerr << "loom-run consolidate: cannot run " << tool.string() << " (" << std::strerror(errno)
            << "); it is installed beside loom-run\n";
  return 127;
}

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "consolidate") return consolidate(argc, argv);
  arguments args;
  CLI::App app("loom-run: start PROGRAM on --devices processes per node with the variables a loom program reads "
               "(Lightning's `fabric run`). Options go before PROGRAM; everything after it is passed to PROGRAM "
               "untouched.",
               "loom-run");
  app.prefix_command();  // parsing stops at the first positional: the program
  app.add_option("--accelerator", args.accelerator, "the hardware to run on")
      ->check(CLI::IsMember(loom::runtime::accelerator_names()));
  const auto strategies = loom::runtime::cli_strategy_names();
  app.add_option("--strategy", args.strategy, "how to run across devices: " + loom::runtime::join(strategies))
      ->check([](const std::string& name) -> std::string {
        const auto* entry = loom::runtime::find_strategy(name);
        const auto accepted = loom::runtime::join(loom::runtime::cli_strategy_names());
        if (entry == nullptr) return "unknown strategy '" + name + "'. Available: " + accepted;
        if (!entry->built) return "strategy '" + name + "' cannot be used: " + entry->reason + ". Available: " + accepted;
        for (const auto& cli : loom::runtime::cli_strategy_names()) {
          if (cli == name) return {};
        }
        return "strategy '" + name + "' cannot be started from the command line (Lightning's rule for spawn, fork, "
               "notebook, xla, tpu and offload variants). Available: " + accepted;
      });
  app.add_option("--devices", args.devices, "devices (processes on cpu) per node: a count, 'auto', or indices '0,1'")
      ->capture_default_str();
  app.add_option("--num-nodes,--num_nodes", args.num_nodes, "number of machines")->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--node-rank,--node_rank", args.node_rank, "index of this machine, 0 to num_nodes - 1")
      ->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--main-address,--main_address", args.main_address, "address of the machine with node rank 0")
      ->capture_default_str();
  app.add_option("--main-port,--main_port", args.main_port, "port on the main machine (several nodes only)")
      ->check(CLI::Range(1, 65535))->capture_default_str();
  app.add_option("--precision", args.precision, "precision: " + loom::runtime::join(loom::runtime::precision_names()))
      ->check(CLI::IsMember(loom::runtime::precision_names()));
  app.footer("PROGRAM [ARGS...]  the program to start on every rank, and its own arguments ('bench': "
             "loom-bench, installed beside loom-run)\n"
             "loom-run consolidate SHARDED_DIR [OUT]  one full checkpoint from a sharded one");
  try {
    app.parse(argc, argv);
    // Everything from the program on is left unparsed, in order.
    args.command = app.remaining();
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  if (args.command.empty()) {
    std::cerr << "loom-run: no program given. Usage: loom-run [OPTIONS] PROGRAM [ARGS...]; see --help\n";
    return 2;
  }
  // `loom-run ... bench [ARGS]`: loom-bench, installed beside loom-run, on every rank.
  if (args.command.front() == "bench") args.command.front() = sibling_tool("loom-bench", argv[0]).string();
  if (args.command.front().rfind("-", 0) == 0) {
    std::cerr << "loom-run: unknown option " << args.command.front() << "; see --help for the accepted ones\n";
    return 2;
  }

  int processes = 0;
  try {
    if (args.node_rank >= args.num_nodes) {
      throw loom::configuration_error("--node-rank " + std::to_string(args.node_rank) + " is not below --num-nodes " +
                                      std::to_string(args.num_nodes));
    }
    processes = processes_per_node(args);
  } catch (const std::exception& error) {
    std::cerr << "loom-run: " << error.what() << '\n';
    return 2;
  }

  // What every rank reads (Lightning's LT_* plus the rank variables).
  using loom::cluster::export_variable;
  export_variable("LT_CLI_USED", "1");
  if (!args.accelerator.empty()) export_variable("LT_ACCELERATOR", args.accelerator);
  if (!args.strategy.empty()) export_variable("LT_STRATEGY", args.strategy);
  export_variable("LT_DEVICES", args.devices);
  export_variable("LT_NUM_NODES", std::to_string(args.num_nodes));
  if (!args.precision.empty()) export_variable("LT_PRECISION", args.precision);
  export_variable("NODE_RANK", std::to_string(args.node_rank));
  export_variable("WORLD_SIZE", std::to_string(processes * args.num_nodes));
  export_variable("MASTER_ADDR", args.main_address);
  export_variable("MASTER_PORT", std::to_string(args.main_port));
  // The cores shared out among this node's processes, unless the user chose.
  export_variable("OMP_NUM_THREADS", std::to_string(loom::launch::threads_per_process(processes)),
                  /*overwrite=*/false);
  // One node: the ranks meet through a file in a private directory, so
  // nothing listens on the network for the rendezvous.
  std::string rendezvous_dir;
  if (args.num_nodes == 1) {
    rendezvous_dir = loom::launch::make_private_directory();
    export_variable(loom::cluster::rendezvous_dir_variable, rendezvous_dir);
  }

  // The collective watchdog of a rank that ends the job writes its message
  // here, so the launcher's summary can say why.
  const std::string report_dir = loom::launch::make_private_directory();
  const std::string report_path = report_dir + "/watchdog-report";
  export_variable("LOOM_WATCHDOG_REPORT", report_path);

  struct sigaction action {};
  action.sa_handler = forward_signal;
  sigemptyset(&action.sa_mask);
  for (int signal : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(signal, &action, nullptr);

  int status = 0;
  {
    loom::launch::supervisor job;
    try {
      for (int local = 0; local < processes && local < max_children; ++local) {
        const pid_t pid = job.start(local, args.command, {{"LOCAL_RANK", std::to_string(local)}});
        child_pids[local] = pid;
        child_count = local + 1;
      }
    } catch (const std::exception& error) {
      std::cerr << "loom-run: " << error.what() << '\n';
      job.terminate_all();
      if (!rendezvous_dir.empty()) loom::launch::remove_directory(rendezvous_dir);
      loom::launch::remove_directory(report_dir);
      return 2;
    }
    const loom::launch::job_outcome outcome = job.wait_all();
    if (outcome.failed_rank) {
      std::cerr << "loom-run: " << outcome.description << " (global rank "
                << args.node_rank * processes + *outcome.failed_rank << "); the other ranks were ended\n";
      status = outcome.exit_code;
      std::ifstream report(report_path);
      if (std::string first; std::getline(report, first) && !first.empty()) {
        std::cerr << "loom-run: the collective watchdog ended the job: " << first << '\n';
      }
    }
  }
  if (!rendezvous_dir.empty()) loom::launch::remove_directory(rendezvous_dir);
  loom::launch::remove_directory(report_dir);
  return status;
}
