// Lightning's _Connector for strings: accelerator, strategy, devices,
// num_nodes and precision as a config file or command line gives them,
// checked and resolved to one compiled combination (or a clear error).
// No torch headers: loom-run validates its flags with this before it starts
// anything, and make_fabric uses it before it builds a Fabric.
#pragma once

#include <loom/cluster/environment.hpp>
#include <loom/devices.hpp>
#include <loom/runtime/names.hpp>

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace loom::runtime {

// Lightning's precision inputs: 64, 32, 16 (ints) or any of precision_names().
class precision_input {
 public:
  precision_input() = default;  // not given: "32-true"
  precision_input(int bits) : text_(std::to_string(bits)), given_(true) {}  // NOLINT: as Lightning accepts ints
  precision_input(const char* text) : text_(text), given_(true) {}          // NOLINT
  precision_input(std::string text) : text_(std::move(text)), given_(true) {}  // NOLINT
  const std::string& text() const noexcept { return text_; }
  bool given() const noexcept { return given_; }

 private:
  std::string text_ = "32-true";
  bool given_ = false;
};

// What the user asked for. Defaults are Lightning's Fabric() defaults, except
// devices: not given means "auto", or the process count an external launcher
// (torchrun, srun, mpirun) started on this node.
struct connector_input {
  std::string accelerator = "auto";
  std::string strategy = "auto";
  devices_spec devices;
  precision_input precision;
  int num_nodes = 1;
  // A strategy given as an object (make_fabric(config, strategy), Lightning's
  // Fabric(strategy=DDPStrategy(...))): its name and facts, used instead of
  // looking the name up.
  std::optional<strategy_name> strategy_object;
};

// What this build and machine can run.
struct machine_facts {
  int cuda_devices = 0;     // usable CUDA devices (0 when LibTorch has no CUDA)
  bool cuda_built = false;  // LibTorch was built with CUDA
  // LibTorch computes bfloat16 matmuls on this CPU with vector instructions
  // (cpu_features::vector_bf16_matmul); when not, bf16 on cpu warns.
  bool cpu_vector_bf16 = true;
  // The strategy names known (Lightning's and loom's, built or not, plus
  // names users registered); defaults to runtime::find_strategy.
  std::function<const strategy_name*(std::string_view)> find_strategy;
  // The names that can be chosen, for error messages; defaults to the built ones.
  std::vector<std::string> available_strategies;
};

// The facts of this build, with the strategy catalog of runtime/names.
// cuda_devices: what the caller counted (the connector does not link CUDA).
machine_facts builtin_machine(int cuda_devices, bool cuda_built);

// The resolved configuration: canonical names, one registered combination.
struct connection {
  std::string accelerator;  // "cpu" | "cuda"
  std::string strategy;     // a registered name ("ddp_find_unused_parameters_true" keeps its preset)
  std::string precision;    // canonical: "32-true", "bf16-mixed", ...
  devices_spec devices;     // as resolved: a count on cpu, indices on cuda
  int processes_per_node = 1;
  int num_nodes = 1;
  std::vector<std::string> warnings;  // Lightning's warnings (legacy spellings, fallbacks)
  cluster::cluster_info cluster;      // the environment that was detected
};

// Lightning's rules: LT_* values from loom-run decide when LT_CLI_USED=1 (a
// value in the code that is not its default and differs is an error naming
// both), legacy precision spellings map with a warning, auto choices
// (accelerator: cuda when available else cpu; strategy: single_device for
// one device, ddp for more or for several nodes), dp on cpu becomes ddp and
// 16-mixed on cpu becomes bf16-mixed (with warnings). Everything that cannot
// work throws loom::configuration_error saying what was asked, why it cannot
// work, and what is accepted.
connection connect(connector_input input, const machine_facts& machine,
                   const cluster::env_lookup& env = cluster::process_environment());

}  // namespace loom::runtime
