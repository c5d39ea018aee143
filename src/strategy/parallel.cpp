// parallel's calls into its distributed_runtime, out of line so that the
// strategy headers do not include the launcher and the runtime.
#include <loom/strategy/distributed_runtime.hpp>
#include <loom/strategy/parallel.hpp>

#include <memory>

namespace loom {

void parallel::setup_environment(const strategy_environment& environment) {
  runtime_ = std::make_shared<detail::distributed_runtime>(environment, options_);
  device_ = runtime_->device();
}

int parallel::world_size() const noexcept { return runtime_ ? runtime_->world_size() : 1; }
int parallel::global_rank() const noexcept { return runtime_ ? runtime_->global_rank() : 0; }
int parallel::local_rank() const noexcept { return runtime_ ? runtime_->local_rank() : 0; }
int parallel::node_rank() const noexcept { return runtime_ ? runtime_->node_rank() : 0; }

void parallel::launch() { runtime_->launch(); }
bool parallel::is_forked_child() const noexcept { return runtime_ && runtime_->is_forked_child(); }

comm::process_group& parallel::group() { return runtime_->group(); }
comm::process_group& parallel::world_group() const { return runtime_->group(); }

}  // namespace loom
