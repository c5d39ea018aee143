#include "builtin_combinations.hpp"

#include <loom/strategy/parallel.hpp>

namespace loom::runtime::builtin {

namespace {

// The options every parallel strategy takes: timeout (seconds, as Lightning's
// timedelta), the watchdog's collective_timeout (seconds, 0: off) and
// process_group_backend.
void read_common(option_reader& reader, std::chrono::milliseconds& timeout, comm::backend& backend,
                 std::chrono::milliseconds& collective_timeout) {
  reader.read_seconds("timeout", timeout);
  reader.read_seconds("collective_timeout", collective_timeout, "the watchdog off");
  std::string backend_name = backend == comm::backend::nccl ? "nccl" : backend == comm::backend::mpi ? "mpi" : "gloo";
  reader.read("process_group_backend", backend_name, {"gloo", "nccl", "mpi"});
  backend = backend_name == "nccl"  ? comm::backend::nccl
            : backend_name == "mpi" ? comm::backend::mpi
                                    : comm::backend::gloo;
}

parallel make_parallel(option_reader& reader, launcher_kind launcher) {
  parallel_options options{.launcher = launcher};
  read_common(reader, options.timeout, options.backend, options.collective_timeout);
  return parallel(options);
}
}  // namespace

void read_parallel_options(option_reader& reader, std::chrono::milliseconds& timeout, comm::backend& backend,
                           std::chrono::milliseconds& collective_timeout) {
  read_common(reader, timeout, backend, collective_timeout);
}

std::vector<std::vector<registry_entry>> parallel_entries() {
  return entries(
      preset<parallel>{"parallel", "loom::parallel",
                       [](option_reader& reader) { return make_parallel(reader, launcher_kind::subprocess); }},
      preset<parallel>{"parallel_fork", "loom::parallel (launcher = fork)",
                       [](option_reader& reader) { return make_parallel(reader, launcher_kind::fork); }});
}

}  // namespace loom::runtime::builtin
