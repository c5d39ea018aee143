// ddp's calls into its engine (c10d's Reducer, ddp_engine.hpp), out of line
// so that the strategy's header includes no engine.
#include <loom/strategy/ddp.hpp>
#include <loom/strategy/ddp_engine.hpp>
#include <loom/util/module_fwd.hpp>

#include <cstdint>
#include <memory>
#include <vector>

namespace loom {

namespace detail {
bool sync_enabled(const ddp_engine& engine) noexcept { return engine.sync_enabled(); }
void set_sync_enabled(ddp_engine& engine, bool enabled) noexcept { engine.set_sync_enabled(enabled); }
}  // namespace detail

ddp::module_state ddp::setup_module(torch::nn::Module& module, bool move_to_device) {
  comm::process_group& world = group();
  if (move_to_device) detail::move_module(module, device_);
  auto engine = std::make_shared<detail::ddp_engine>(module, world, options_);
  engines_.add(engine);
  return engine;
}

std::uint64_t ddp::gradient_collectives() const {
  std::uint64_t total = 0;
  engines_.for_each([&](detail::ddp_engine& engine) { total += engine.collectives_issued(); });
  return total;
}

std::uint64_t ddp::gradient_collectives_recorded() const {
  std::uint64_t total = 0;
  engines_.for_each([&](detail::ddp_engine& engine) { total += engine.collectives_recorded(); });
  return total;
}

std::size_t ddp::gradient_buckets() const {
  std::size_t total = 0;
  engines_.for_each([&](detail::ddp_engine& engine) { total += engine.bucket_count(); });
  return total;
}

void ddp::before_forward(detail::ddp_engine& engine) { engine.before_forward(); }

bool ddp::after_forward(detail::ddp_engine& engine, const std::vector<at::Tensor>& outputs) {
  engine.after_forward(outputs);
  return engine.needs_static_graph_sink();
}

at::Tensor ddp::static_graph_sink(detail::ddp_engine& engine, const at::Tensor& output) {
  return engine.static_graph_sink(output);
}

}  // namespace loom
