// loom's gradient reduction for two ranks on Gloo, as a c10d::Reducer comm
// hook: each bucket is divided by the world size and swapped with the peer
// through c10d's send/recv, then summed. One round instead of the ring's two
// (reduce-scatter, all-gather): about a third faster on loopback for DDP's
// bucket sizes (bench/ddp_vs_torch.sh). The sum a + b is the same bits on
// both ranks (addition commutes), so the ranks stay bit-identical.
// Private to src/.
#pragma once

#include "../comm/process_group_state.hpp"

#include <torch/csrc/distributed/c10d/comm.hpp>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

namespace loom::detail {

class pairwise_exchange_hook final : public c10d::CommHookInterface {
 public:
  // group: the engine's two-rank group; reductions: counts the buckets reduced.
  pairwise_exchange_hook(std::shared_ptr<comm::process_group_state> group, std::atomic<std::uint64_t>* reductions);
  ~pairwise_exchange_hook() override;

  // Runs on the autograd thread as a bucket fills: queues it and returns at once.
  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override;
  at::Tensor parseHookResult(const c10::IValue& result) override;

 private:
  struct job {
    at::Tensor buffer;
    c10::intrusive_ptr<c10::ivalue::Future> done;
  };
  void run();

  std::shared_ptr<comm::process_group_state> group_;
  std::atomic<std::uint64_t>* reductions_;
  int peer_;
  at::Tensor incoming_;  // reused receive buffer, grown to the largest bucket
  std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<job> queue_;
  bool stopping_ = false;
  std::thread worker_;  // the exchanges run in bucket order, off the autograd thread
};

}  // namespace loom::detail
