#include "builtin_combinations.hpp"

#include <loom/strategy/ddp.hpp>

namespace loom::runtime::builtin {

namespace {
// ddp_options under Lightning's DDPStrategy argument names, over a preset's defaults.
ddp make_ddp(option_reader& reader, ddp_options options) {
  read_process_options(reader, options.process);
  reader.read("find_unused_parameters", options.find_unused_parameters);
  reader.read("broadcast_buffers", options.broadcast_buffers);
  reader.read("bucket_cap_mb", options.bucket_cap_mb, 0.0, 1e6);
  reader.read("first_bucket_mb", options.first_bucket_mb, 0.0, 1e6);
  reader.read("gradient_as_bucket_view", options.gradient_as_bucket_view);
  reader.read("static_graph", options.static_graph);
  reader.read("pairwise_exchange", options.pairwise_exchange);
  return ddp(options);
}
}  // namespace

std::vector<std::vector<registry_entry>> ddp_entries() {
  return entries(
      preset<ddp>{"ddp", "loom::ddp", [](option_reader& reader) { return make_ddp(reader, {}); }},
      preset<ddp>{"ddp_fork", "loom::ddp (launcher = fork)",
                  [](option_reader& reader) { return make_ddp(reader, {.process = {.launcher = launcher_kind::fork}}); }},
      preset<ddp>{"ddp_find_unused_parameters_true", "loom::ddp (find_unused_parameters = true)",
                  [](option_reader& reader) { return make_ddp(reader, {.find_unused_parameters = true}); }},
      preset<ddp>{"ddp_find_unused_parameters_false", "loom::ddp (find_unused_parameters = false)",
                  [](option_reader& reader) { return make_ddp(reader, {}); }});
}

}  // namespace loom::runtime::builtin
