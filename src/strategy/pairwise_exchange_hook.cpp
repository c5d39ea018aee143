#include "pairwise_exchange_hook.hpp"

#include <ATen/ATen.h>

namespace loom::detail {

namespace {
constexpr int exchange_tag = 0x10;
}

pairwise_exchange_hook::pairwise_exchange_hook(std::shared_ptr<comm::process_group_state> group,
                                               std::atomic<std::uint64_t>* reductions)
    : group_(std::move(group)), reductions_(reductions), peer_(1 - group_->rank) {
  worker_ = std::thread([this] { run(); });
}

pairwise_exchange_hook::~pairwise_exchange_hook() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  ready_.notify_one();
  worker_.join();
}

c10::intrusive_ptr<c10::ivalue::Future> pairwise_exchange_hook::runHook(c10d::GradBucket& bucket) {
  auto done = c10::make_intrusive<c10::ivalue::Future>(c10::TensorType::get());
  reductions_->fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back({bucket.getBufferRef(), done});
  }
  ready_.notify_one();
  return done;
}

at::Tensor pairwise_exchange_hook::parseHookResult(const c10::IValue& result) {
  // c10d's own parser is not exported by libtorch_cpu; the future holds a tensor.
  return result.isTensor() ? result.toTensor() : result.toTensorVector().at(0);
}

void pairwise_exchange_hook::run() {
  for (;;) {
    job next;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      ready_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      next = std::move(queue_.front());
      queue_.pop_front();
    }
    try {
      if (group_->is_broken.load(std::memory_order_acquire)) {
        std::lock_guard<std::mutex> lock(group_->broken_mutex);
        throw peer_error("ddp gradient exchange: the process group is unusable after an earlier failure: " +
                         group_->broken);
      }
      at::Tensor& buffer = next.buffer;
      // Divide first (as PyTorch's allreduce hook), so both halves of the sum are averaged values.
      buffer.div_(2);
      if (!incoming_.defined() || incoming_.numel() < buffer.numel() || incoming_.scalar_type() != buffer.scalar_type()) {
        incoming_ = at::empty({buffer.numel()}, buffer.options());
      }
      // A two-rank all-reduce built from send/recv: the watchdog sees it as one.
      const comm::timed_collective timing(
          group_->watch &&
          group_->watch->recorder->record(comm::collective_kind::all_reduce, &buffer, comm::bytes_of(buffer)));
      std::vector<at::Tensor> outgoing{buffer};
      std::vector<at::Tensor> received{incoming_.narrow(0, 0, buffer.numel())};
      try {
        auto sent = group_->backend->send(outgoing, peer_, exchange_tag);
        auto got = group_->backend->recv(received, peer_, exchange_tag);
        got->wait();
        sent->wait();
      } catch (const peer_error&) {
        throw;
      } catch (const std::exception& error) {
        throw comm::failed(*group_, "ddp gradient exchange", error);
      }
      buffer.add_(received[0].view(buffer.sizes()));
      next.done->markCompleted(c10::IValue(buffer));
    } catch (...) {
      next.done->setError(std::current_exception());
    }
  }
}

}  // namespace loom::detail
