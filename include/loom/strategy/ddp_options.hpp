// What loom::ddp is configured with (Lightning's DDPStrategy arguments and
// torch's DistributedDataParallel's), apart from its engine (ddp_engine.hpp)
// so that the strategy's header needs no engine.
#pragma once

#include <loom/strategy/process_options.hpp>

namespace loom {

struct ddp_options {
  // Parameters a forward may leave unused (a skipped branch): found by walking
  // the graph from the outputs every step, as Python DDP does.
  bool find_unused_parameters = false;
  // Buffers (batch-norm statistics) are broadcast from rank 0 before each forward.
  bool broadcast_buffers = true;
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  // Gradients are views into the communication buckets (no copy in and out).
  bool gradient_as_bucket_view = false;
  // The set of used parameters and the graph are the same every step.
  bool static_graph = false;
  // Two ranks on Gloo: reduce each bucket by swapping it with the peer
  // (c10d send/recv, one round) instead of Gloo's ring all-reduce (two).
  bool pairwise_exchange = true;
  // The processes it runs on (timeout, backend, launcher, MPI communicator,
  // watchdog), as every distributed strategy takes them
  // (Lightning's "ddp_fork" is ddp with .process.launcher = fork).
  process_options process;
};

}  // namespace loom
