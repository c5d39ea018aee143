// The watchdog's records over MPI, for the MPI group (which has no store):
// a duplicate of the group's communicator that only the watchdog uses, so
// its messages never match the group's collectives or the application's.
// Non-blocking sends (small: MPI's eager path completes them at once, even to
// a stopped peer) and MPI_Iprobe'd receives; nothing waits.
#include "mpi_backend.hpp"
#include "watchdog_exchanges.hpp"

#include <array>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace loom::comm {

namespace {

constexpr int record_tag = 1;
constexpr int verdict_tag = 2;
constexpr std::size_t message_bytes = 2048;

struct outgoing {
  std::array<char, message_bytes> buffer{};
  MPI_Request request = MPI_REQUEST_NULL;
};

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

class mpi_exchange_impl final : public watchdog_exchange {
 public:
  explicit mpi_exchange_impl(MPI_Comm group) {
    if (MPI_Comm_dup(group, &comm_) != MPI_SUCCESS) throw std::runtime_error("watchdog: MPI_Comm_dup failed");
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    records_.resize(static_cast<std::size_t>(size_));
    sends_.resize(static_cast<std::size_t>(size_));
  }

  ~mpi_exchange_impl() override {
    if (mpi_finalized()) return;  // MPI_Finalize released everything
    for (auto& send : sends_) {
      if (send.request != MPI_REQUEST_NULL) {
        MPI_Cancel(&send.request);
        MPI_Request_free(&send.request);
      }
    }
    if (verdict_send_.request != MPI_REQUEST_NULL) MPI_Request_free(&verdict_send_.request);
    MPI_Comm_free(&comm_);
  }

  void publish(const std::string& record) override {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_) post(sends_[static_cast<std::size_t>(peer)], record, peer, record_tag);
    }
  }

  std::optional<std::string> record_of(int rank) override {
    std::lock_guard<std::mutex> lock(mutex_);
    drain();
    return records_[static_cast<std::size_t>(rank)];
  }

  // One buffer serves every peer: the same text, sent once and never rewritten.
  void announce(const std::string& verdict) override {
    std::lock_guard<std::mutex> lock(mutex_);
    const std::size_t length = std::min(verdict.size(), message_bytes - 1);
    std::memcpy(verdict_send_.buffer.data(), verdict.data(), length);
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      MPI_Request request = MPI_REQUEST_NULL;
      MPI_Isend(verdict_send_.buffer.data(), static_cast<int>(length), MPI_CHAR, peer, verdict_tag, comm_, &request);
      if (request != MPI_REQUEST_NULL) MPI_Request_free(&request);
    }
  }

  std::optional<std::string> verdict() override {
    std::lock_guard<std::mutex> lock(mutex_);
    drain();
    return verdict_;
  }

  [[noreturn]] void end_job(int exit_code) override {
    MPI_Abort(comm_, exit_code);
    std::_Exit(exit_code);
  }

 private:
  // A peer whose previous record is still in flight (stopped, not reading)
  // is skipped this time: nothing queues up behind it.
  void post(outgoing& send, const std::string& text, int peer, int tag) {
    if (send.request != MPI_REQUEST_NULL) {
      int done = 0;
      MPI_Test(&send.request, &done, MPI_STATUS_IGNORE);
      if (!done) return;
    }
    const std::size_t length = std::min(text.size(), message_bytes - 1);
    std::memcpy(send.buffer.data(), text.data(), length);
    MPI_Isend(send.buffer.data(), static_cast<int>(length), MPI_CHAR, peer, tag, comm_, &send.request);
  }

  void drain() {
    for (;;) {
      int flag = 0;
      MPI_Status status;
      if (MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, comm_, &flag, &status) != MPI_SUCCESS || !flag) return;
      int count = 0;
      MPI_Get_count(&status, MPI_CHAR, &count);
      std::string text(static_cast<std::size_t>(std::max(count, 0)), '\0');
      MPI_Recv(text.data(), count, MPI_CHAR, status.MPI_SOURCE, status.MPI_TAG, comm_, MPI_STATUS_IGNORE);
      if (status.MPI_TAG == verdict_tag) {
        if (!verdict_) verdict_ = text;
      } else {
        records_[static_cast<std::size_t>(status.MPI_SOURCE)] = std::move(text);
      }
    }
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::mutex mutex_;
  std::vector<std::optional<std::string>> records_;
  std::vector<outgoing> sends_;
  outgoing verdict_send_;
  std::optional<std::string> verdict_;
};

}  // namespace

std::unique_ptr<watchdog_exchange> mpi_exchange(const mpi_backend& group) {
  return std::make_unique<mpi_exchange_impl>(group.communicator());
}

}  // namespace loom::comm
