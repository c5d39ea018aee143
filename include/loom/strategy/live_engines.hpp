// The engines of a strategy's set-up modules (ddp's reducers, the sharding
// engines of fsdp, deepspeed and model_parallel), held weakly: a wrapped
// module owns its engine, and the strategy reaches the live ones for its
// counters, checkpoints and full-state scopes. The dead are dropped as new
// ones are added, so a loop that sets up a module per epoch keeps one entry.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace loom::detail {

// Each entry that is still alive, locked (for as long as the result lives).
template <class Engine>
std::vector<std::shared_ptr<Engine>> lock_live(const std::vector<std::weak_ptr<Engine>>& entries) {
  std::vector<std::shared_ptr<Engine>> live;
  for (const auto& weak : entries) {
    if (std::shared_ptr<Engine> engine = weak.lock()) live.push_back(std::move(engine));
  }
  return live;
}

template <class Engine>
class live_engines {
 public:
  void add(const std::shared_ptr<Engine>& engine) {
    std::erase_if(engines_, [](const std::weak_ptr<Engine>& weak) { return weak.expired(); });
    engines_.push_back(engine);
  }
  // visit(Engine&) for each live engine, in setup order.
  template <class Visit>
  void for_each(Visit&& visit) const {
    for (const auto& weak : engines_) {
      if (const std::shared_ptr<Engine> engine = weak.lock()) visit(*engine);
    }
  }
  // The entries themselves (some may have died since the last add), for the
  // functions that lock each as they go (full_state.hpp, save_layout).
  const std::vector<std::weak_ptr<Engine>>& entries() const noexcept { return engines_; }
  std::size_t entry_count() const noexcept { return engines_.size(); }

 private:
  std::vector<std::weak_ptr<Engine>> engines_;
};

}  // namespace loom::detail
