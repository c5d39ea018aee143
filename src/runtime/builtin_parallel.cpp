#include "builtin_combinations.hpp"

#include <loom/strategy/parallel.hpp>

namespace loom::runtime::builtin {

void read_process_options(option_reader& reader, process_options& options) {
  reader.read_seconds("timeout", options.timeout);
  reader.read_seconds("collective_timeout", options.collective_timeout, "the watchdog off");
  comm::backend& backend = options.backend;
  std::string backend_name = backend == comm::backend::nccl ? "nccl" : backend == comm::backend::mpi ? "mpi" : "gloo";
  reader.read("process_group_backend", backend_name, {"gloo", "nccl", "mpi"});
  backend = backend_name == "nccl"  ? comm::backend::nccl
            : backend_name == "mpi" ? comm::backend::mpi
                                    : comm::backend::gloo;
}

namespace {
parallel make_parallel(option_reader& reader, launcher_kind launcher) {
  parallel_options options{.launcher = launcher};
  read_process_options(reader, options);
  return parallel(options);
}
}  // namespace

std::vector<std::vector<registry_entry>> parallel_entries() {
  return entries(
      preset<parallel>{"parallel", "loom::parallel",
                       [](option_reader& reader) { return make_parallel(reader, launcher_kind::subprocess); }},
      preset<parallel>{"parallel_fork", "loom::parallel (launcher = fork)",
                       [](option_reader& reader) { return make_parallel(reader, launcher_kind::fork); }});
}

}  // namespace loom::runtime::builtin
