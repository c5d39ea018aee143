// One way to read the environment. Every variable loom reads (LOOM_*, LT_*,
// PL_*, the launchers' and MPI's, GLOO_SOCKET_IFNAME) is read through an
// env_lookup, and every setting through one parser below: a value that is
// malformed or out of range is a configuration_error naming the variable,
// its value and what is accepted, never a silent default. Tests pass a
// recorded environment instead of the process's. The one place loom sets a
// variable is export_variable: a launcher handing a value to the processes
// it starts. docs/configuration.md lists every variable. No torch headers.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>

namespace loom::cluster {

// Reads one environment variable: nullopt when it is unset.
using env_lookup = std::function<std::optional<std::string>(std::string_view name)>;

env_lookup process_environment();
env_lookup recorded_environment(std::map<std::string, std::string> variables);

// A setting's text; nullopt when it is unset or empty.
std::optional<std::string> setting_text(std::string_view name, const env_lookup& env = process_environment());

// A whole-number setting from minimum to maximum; nullopt when unset or empty.
std::optional<long long> setting_integer(std::string_view name, long long minimum, long long maximum,
                                         const env_lookup& env = process_environment());

// A duration in seconds (a decimal number such as 2.5) from 0 to maximum;
// nullopt when unset or empty.
std::optional<double> setting_seconds(std::string_view name, double maximum,
                                      const env_lookup& env = process_environment());

// The whole number `text` spells exactly (an optional '-', then digits, and
// nothing else); nullopt for anything else, an empty text included. The one
// integer parse behind the settings above and the cluster environments'
// variables (which keep messages of their own).
std::optional<long long> whole_number(std::string_view text) noexcept;

// Sets name=value in this process's environment, for the processes it
// starts next: loom-run and fabric.launch() hand each rank its LOCAL_RANK,
// WORLD_SIZE, LT_* and rendezvous directory; seed_everything leaves
// PL_GLOBAL_SEED for the ranks and workers started after it (as Lightning
// does); the MPI group sets Open MPI's mpi_yield_when_idle before MPI_Init,
// which reads its parameters only from the environment. overwrite=false
// keeps a value the user set.
void export_variable(std::string_view name, const std::string& value, bool overwrite = true);

}  // namespace loom::cluster
