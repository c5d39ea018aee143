// The handle of an asynchronous collective: the communication runs while the
// caller computes, and wait() returns once the result is complete in the
// output buffer, including any local step an emulation needs (the sum of a
// point-to-point reduce-scatter). No c10d type leaks through this header.
#pragma once

#include <memory>

namespace loom::comm {

struct process_group_state;
struct work_slot;

class [[nodiscard("a collective's handle: call wait() before reading the output")]] work {
 public:
  work() noexcept = default;  // nothing pending
  work(const work&) = delete;
  work& operator=(const work&) = delete;
  work(work&& other) noexcept : group_(std::move(other.group_)), slot_(other.slot_) { other.slot_ = nullptr; }
  work& operator=(work&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      group_ = std::move(other.group_);
      slot_ = other.slot_;
      other.slot_ = nullptr;
    }
    return *this;
  }
  // A dropped handle still completes its collective (the output and the
  // peers depend on it); a failure then only marks the group broken.
  ~work() { finish_quietly(); }

  // Blocks until the output is complete. Throws loom::peer_error naming the
  // rank when a peer went away (the group is then unusable).
  void wait();
  bool pending() const noexcept { return slot_ != nullptr; }

 private:
  friend struct work_access;
  work(std::shared_ptr<process_group_state> group, work_slot* slot) noexcept
      : group_(std::move(group)), slot_(slot) {}
  void finish_quietly() noexcept;

  std::shared_ptr<process_group_state> group_;
  work_slot* slot_ = nullptr;
};

}  // namespace loom::comm
