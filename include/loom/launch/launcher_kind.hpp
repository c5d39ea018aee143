// How a parallel strategy's launch() starts the local ranks when nobody else
// did: a run-time option of the strategy (Lightning's ddp vs ddp_fork names
// are presets of one strategy, not two types).
#pragma once

namespace loom {

enum class launcher_kind {
  subprocess,  // re-executes this program (Lightning's _SubprocessScriptLauncher)
  fork,        // forks this process in launch(fn), before LibTorch starts threads
};

}  // namespace loom
