// The guard fabric.no_backward_sync returns under a strategy whose engine
// synchronises gradients (DDP's reducer, FSDP's sharding engine): backward
// passes inside it leave gradients unsynchronised, and the guard puts the
// engine's previous setting back when it ends.
#pragma once

namespace loom {

template <class Engine>
class [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] no_sync_guard {
 public:
  no_sync_guard(Engine& engine, bool enabled) : no_sync_guard(&engine, enabled) {}
  // A null engine (nothing synchronised: a dimension of one rank): does nothing.
  no_sync_guard(Engine* engine, bool enabled) : engine_(engine), previous_(engine != nullptr && engine->sync_enabled()) {
    if (engine_ != nullptr && enabled) engine_->set_sync_enabled(false);
  }
  no_sync_guard(const no_sync_guard&) = delete;
  no_sync_guard& operator=(const no_sync_guard&) = delete;
  ~no_sync_guard() {
    if (engine_ != nullptr) engine_->set_sync_enabled(previous_);
  }

 private:
  Engine* engine_;
  bool previous_;
};

}  // namespace loom
