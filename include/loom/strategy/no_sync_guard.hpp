// The guard fabric.no_backward_sync returns under a strategy whose engine
// synchronises gradients (DDP's reducer, FSDP's sharding engine): backward
// passes inside it leave gradients unsynchronised, and the guard puts the
// engine's previous setting back when it ends. The engine is reached through
// two functions found next to its declaration (sync_enabled and
// set_sync_enabled of Engine&, compiled in src/), so the guard needs no
// engine header.
#pragma once

namespace loom {

template <class Engine>
class [[nodiscard("a guard acts only while it lives: name it (auto guard = ...)")]] no_sync_guard {
 public:
  no_sync_guard(Engine& engine, bool enabled) : no_sync_guard(&engine, enabled) {}
  // A null engine (nothing synchronised: a dimension of one rank): does nothing.
  no_sync_guard(Engine* engine, bool enabled) : engine_(engine), previous_(engine != nullptr && sync_enabled(*engine)) {
    if (engine_ != nullptr && enabled) set_sync_enabled(*engine_, false);
  }
  no_sync_guard(const no_sync_guard&) = delete;
  no_sync_guard& operator=(const no_sync_guard&) = delete;
  ~no_sync_guard() {
    if (engine_ != nullptr) set_sync_enabled(*engine_, previous_);
  }

 private:
  Engine* engine_;
  bool previous_;
};

}  // namespace loom
