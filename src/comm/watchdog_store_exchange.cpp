#include "watchdog_exchanges.hpp"

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <future>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <thread>

namespace loom::comm {

namespace {

constexpr const char* verdict_key = "loom/watchdog/verdict";

std::vector<std::uint8_t> bytes_of(const std::string& text) { return {text.begin(), text.end()}; }
std::string text_of(const std::vector<std::uint8_t>& bytes) { return {bytes.begin(), bytes.end()}; }

// Runs store calls on a thread of its own and gives each an answer time.
// A TCPStore's server is a thread of global rank 0's process: kill -STOP of
// rank 0 freezes it, and a client's call then waits for the store's own
// timeout (the group's, 30 minutes by default). The watchdog must still
// decide, so it waits for an answer only so long. The thread is detached and
// owns what it uses: a call may never return, and the process must still be
// able to end.
class answering_thread {
 public:
  answering_thread() : shared_(std::make_shared<shared>()) {
    std::thread([state = shared_] { serve(*state); }).detach();
  }
  ~answering_thread() {
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      shared_->stopping = true;
    }
    shared_->wake.notify_one();
  }
  answering_thread(const answering_thread&) = delete;
  answering_thread& operator=(const answering_thread&) = delete;

  // call's result, or exchange_unanswered (what() from unanswered(seconds
  // waited)) when it has not returned within answer_within, or when an
  // earlier call has been waiting longer than that already (nothing more is
  // queued behind a call that hangs).
  template <class Result>
  Result run(std::function<Result()> call, std::chrono::milliseconds answer_within,
             const std::function<std::string(double)>& unanswered) {
    const auto now = std::chrono::steady_clock::now();
    auto task = std::make_shared<std::packaged_task<Result()>>(std::move(call));
    auto answer = task->get_future();
    {
      std::lock_guard<std::mutex> lock(shared_->mutex);
      if (shared_->busy_since && now - *shared_->busy_since > answer_within) {
        throw exchange_unanswered(unanswered(seconds(now - *shared_->busy_since)));
      }
      shared_->calls.emplace_back([task] { (*task)(); });
    }
    shared_->wake.notify_one();
    if (answer.wait_for(answer_within) == std::future_status::timeout) {
      throw exchange_unanswered(unanswered(seconds(std::chrono::steady_clock::now() - now)));
    }
    return answer.get();
  }

 private:
  struct shared {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::function<void()>> calls;
    std::optional<std::chrono::steady_clock::time_point> busy_since;
    bool stopping = false;
  };
  static double seconds(std::chrono::steady_clock::duration d) { return std::chrono::duration<double>(d).count(); }

  static void serve(shared& state) {
    std::unique_lock<std::mutex> lock(state.mutex);
    for (;;) {
      state.wake.wait(lock, [&] { return state.stopping || !state.calls.empty(); });
      if (state.stopping) return;
      auto call = std::move(state.calls.front());
      state.calls.pop_front();
      state.busy_since = std::chrono::steady_clock::now();
      lock.unlock();
      call();  // a packaged_task: its exception goes to the caller's future
      lock.lock();
      state.busy_since.reset();
    }
  }

  std::shared_ptr<shared> shared_;
};

class store_exchange_impl final : public watchdog_exchange {
 public:
  store_exchange_impl(c10::intrusive_ptr<c10d::Store> group_store, c10::intrusive_ptr<c10d::Store> root_store, int rank,
                      std::optional<store_host> host)
      : group_(std::move(group_store)), root_(std::move(root_store)), own_key_(key_of(rank)), host_(host) {
    if (host_) answering_ = std::make_unique<answering_thread>();
  }

  // Each call owns what it uses (the stores, copies of the key and bytes):
  // one that gets no answer runs on after this frame, perhaps after this
  // exchange.
  void publish(const std::string& record) override {
    bounded<bool>([store = group_, key = own_key_, bytes = bytes_of(record)] {
      store->set(key, bytes);
      return true;
    });
  }

  // check first: a get would wait for a key that is not there.
  std::optional<std::string> record_of(int rank) override {
    return bounded<std::optional<std::string>>([store = group_, key = key_of(rank)]() -> std::optional<std::string> {
      if (!store->check({key})) return std::nullopt;
      return text_of(store->get(key));
    });
  }

  void announce(const std::string& verdict) override {
    bounded<bool>([store = root_, bytes = bytes_of(verdict)] {
      store->set(verdict_key, bytes);
      return true;
    });
  }

  std::optional<std::string> verdict() override {
    return bounded<std::optional<std::string>>([store = root_]() -> std::optional<std::string> {
      if (!store->check({verdict_key})) return std::nullopt;
      return text_of(store->get(verdict_key));
    });
  }

  [[noreturn]] void end_job(int exit_code) override { std::_Exit(exit_code); }

 private:
  static std::string key_of(int rank) { return "watchdog/record/" + std::to_string(rank); }

  // A store with a server process (TCP) answers within host_->answer_within
  // or the call is exchange_unanswered; a FileStore has no server to stop,
  // and its calls run here.
  template <class Result, class Call>
  Result bounded(Call&& call) {
    if (!answering_) return call();
    std::function<Result()> owned = [call = std::forward<Call>(call)]() mutable { return call(); };
    return answering_->run<Result>(std::move(owned), host_->answer_within, [&](double waited) {
      std::ostringstream out;
      out << "rank " << host_->global_rank << ", which hosts the rendezvous store, has not answered for "
          << std::fixed << std::setprecision(1) << waited << " s";
      return out.str();
    });
  }

  c10::intrusive_ptr<c10d::Store> group_;
  c10::intrusive_ptr<c10d::Store> root_;
  std::string own_key_;
  std::optional<store_host> host_;
  std::unique_ptr<answering_thread> answering_;
};

}  // namespace

std::unique_ptr<watchdog_exchange> store_exchange(c10::intrusive_ptr<c10d::Store> group_store,
                                                  c10::intrusive_ptr<c10d::Store> root_store, int rank,
                                                  std::optional<store_host> host) {
  return std::make_unique<store_exchange_impl>(std::move(group_store), std::move(root_store), rank, host);
}

}  // namespace loom::comm
