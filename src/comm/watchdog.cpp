#include "watchdog.hpp"

#include "watchdog_exchanges.hpp"

#include <loom/comm/process_group.hpp>
#include <loom/environment.hpp>

#include <cxxabi.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iomanip>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>
#include <typeinfo>

namespace loom::comm {

namespace {

constexpr std::size_t record_window = 8;  // entries each record carries
std::atomic<int> pauses{0};

std::int64_t steady_now_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

// How often the thread looks: an eighth of the timeout, within [50 ms, 5 s].
std::chrono::milliseconds period_of(std::chrono::milliseconds timeout) {
  return std::clamp(timeout / 8, std::chrono::milliseconds(50), std::chrono::milliseconds(5000));
}

void write_stderr(const std::string& text) {
  const std::string line = text + "\n";
  std::size_t done = 0;
  while (done < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + done, line.size() - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
}

// The watchdog's message, on stderr and in loom-run's report file
// (LOOM_WATCHDOG_REPORT), from which loom-run's summary quotes it.
void tell(const std::string& message) {
  write_stderr(message);
  if (const auto report = cluster::setting_text("LOOM_WATCHDOG_REPORT")) {
    std::ofstream(*report, std::ios::app) << message << '\n';
  }
}

std::string seconds_text(std::int64_t ns) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << static_cast<double>(ns) / 1e9 << " s";
  return out.str();
}

std::string group_text(const group_watch& group) {
  return "group '" + group.group_name + "' (" + std::to_string(group.size) + " ranks)";
}

int global_rank(const group_watch& group, int rank) { return group.global_ranks[static_cast<std::size_t>(rank)]; }

// The first sequence number at which two windows disagree.
std::optional<std::pair<collective_entry, collective_entry>> first_mismatch(
    const std::vector<collective_entry>& mine, const std::vector<collective_entry>& theirs) {
  for (const auto& a : mine) {
    for (const auto& b : theirs) {
      if (a.sequence == b.sequence && !a.matches(b)) return std::make_pair(a, b);
    }
  }
  return std::nullopt;
}

std::string desync_sentence(const group_watch& group, int peer, const collective_entry& mine,
                            const collective_entry& theirs) {
  return "desynchronised collectives in " + group_text(group) + ": at collective #" + std::to_string(mine.sequence) +
         " rank " + std::to_string(global_rank(group, group.rank)) + " entered " + mine.describe() + " and rank " +
         std::to_string(global_rank(group, peer)) + " entered " + theirs.describe() +
         " (every rank must issue the same collectives in the same order)";
}

// A peer's latest record, if one reached this rank and reads as one.
std::optional<peer_record> record_of(group_watch& group, int peer) {
  const auto text = group.exchange->record_of(peer);
  return text ? decode_record(*text) : std::nullopt;
}

// The desync sentence, when the peer's record disagrees with this rank's
// recent entries at some sequence number.
std::optional<std::string> desync_with(const group_watch& group, int peer, const std::vector<collective_entry>& mine,
                                       const peer_record& record) {
  if (auto mismatch = first_mismatch(mine, record.entries)) {
    return desync_sentence(group, peer, mismatch->first, mismatch->second);
  }
  return std::nullopt;
}

class watchdog_thread {
 public:
  static watchdog_thread& instance() {
    static watchdog_thread thread;
    return thread;
  }

  void add(const std::shared_ptr<group_watch>& group) {
    std::lock_guard<std::mutex> lock(mutex_);
    groups_.push_back(group);
    period_ = std::min(period_, period_of(group->timeout));
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    wake_.notify_one();
  }

  // The groups still alive (for the terminate handler below).
  std::vector<std::shared_ptr<group_watch>> live() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::shared_ptr<group_watch>> alive;
    for (const auto& weak : groups_) {
      if (auto group = weak.lock()) alive.push_back(std::move(group));
    }
    return alive;
  }

  ~watchdog_thread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_) {
      wake_.wait_for(lock, period_);
      if (stopping_) break;
      std::vector<std::shared_ptr<group_watch>> live;
      groups_.erase(std::remove_if(groups_.begin(), groups_.end(),
                                   [&](const std::weak_ptr<group_watch>& weak) {
                                     auto group = weak.lock();
                                     if (!group) return true;
                                     live.push_back(std::move(group));
                                     return false;
                                   }),
                    groups_.end());
      lock.unlock();
      for (const auto& group : live) {
        try {
          look_at(*group);
        } catch (const std::exception& error) {
          // The exchange failed (the store went away with rank 0): the
          // group's own timeout still bounds every wait; say it once.
          if (!warned_) write_stderr(std::string("loom watchdog: cannot compare records: ") + error.what());
          warned_ = true;
        }
      }
      live.clear();
      lock.lock();
    }
  }

  void look_at(group_watch& group) {
    const bool paused = pauses.load(std::memory_order_relaxed) > 0;
    const std::uint64_t entered = group.recorder->entered();
    group.heartbeat.fetch_add(1, std::memory_order_relaxed);
    // The exchange's server may be stopped (a TCPStore lives in rank 0): that
    // is only news when this rank is stuck too, below.
    std::optional<std::string> unanswered;
    try {
      group.exchange->publish(encode_record(group, paused));
      if (auto verdict = group.exchange->verdict()) {
        end(group, "loom watchdog (rank " + std::to_string(global_rank(group, group.rank)) + "): " + *verdict,
            /*decided=*/false);
      }
    } catch (const exchange_unanswered& error) {
      unanswered = error.what();
    }
    const auto last = (paused || entered == 0) ? std::nullopt : group.recorder->at(entered - 1);
    const std::int64_t timeout_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(group.timeout).count();
    const std::int64_t now = steady_now_ns();
    const std::int64_t waited = last ? now - last->entered_ns : 0;
    if (waited <= timeout_ns / 2) {
      group.heard.clear();
      return;
    }
    // From half the timeout on, the peers' records are read every look, so
    // that at the timeout a peer whose heartbeat stopped can be told apart.
    std::vector<std::optional<peer_record>> records(static_cast<std::size_t>(group.size));
    for (int peer = 0; peer < group.size && !unanswered; ++peer) {
      if (peer == group.rank) continue;
      try {
        records[static_cast<std::size_t>(peer)] = record_of(group, peer);
      } catch (const exchange_unanswered& error) {
        unanswered = error.what();
      }
    }
    note_heartbeats(group, records, now);
    if (waited <= timeout_ns) return;

    std::ostringstream waiting;
    waiting << "rank " << global_rank(group, group.rank) << " has waited " << seconds_text(waited)
            << " (collective_timeout " << seconds_text(timeout_ns) << ") in collective #" << last->sequence << " "
            << last->describe() << " of " << group_text(group);
    // Nobody can read or write records: every live rank ends on its own.
    if (unanswered) {
      end(group,
          "loom watchdog: " + waiting.str() + ", and " + *unanswered +
              ": it is stopped or gone, and the ranks cannot compare what they entered. Ending this rank (exit code " +
              std::to_string(watchdog_exit_code) + "); every live rank does the same.",
          /*decided=*/false);
    }

    const auto mine = group.recorder->recent(record_window);
    std::vector<std::string> behind;   // have not entered it
    std::vector<std::string> stopped;  // entered it, and their processes stopped reporting
    for (int peer = 0; peer < group.size; ++peer) {
      if (peer == group.rank) continue;
      const auto& record = records[static_cast<std::size_t>(peer)];
      if (record) {
        if (auto desync = desync_with(group, peer, mine, *record)) decide(group, *desync);
        if (record->paused) continue;
        if (record->entered >= entered) {
          if (auto silence = silent_for(group, peer, now)) stopped.push_back(stopped_text(group, peer, *record, *silence));
          continue;  // alive and in it: a long collective, not a stuck one
        }
      }
      behind.push_back(behind_text(group, peer, record));
    }
    if (behind.empty() && stopped.empty()) return;
    std::ostringstream message;
    message << waiting.str();
    if (!behind.empty()) {
      message << ", which " << joined(behind) << (behind.size() == 1 ? " has" : " have")
              << " not entered: stuck, or slower than collective_timeout";
    }
    if (!stopped.empty()) {
      message << (behind.empty() ? "; " : "; and ") << joined(stopped) << (stopped.size() == 1 ? " is" : " are")
              << " stopped or hung inside it";
    }
    message << ". Ending every rank (exit code " << watchdog_exit_code << ").";
    decide(group, message.str());
  }

  // Remembers when each peer's heartbeat last moved, as this rank saw it.
  static void note_heartbeats(group_watch& group, const std::vector<std::optional<peer_record>>& records,
                              std::int64_t now) {
    group.heard.resize(records.size());
    for (std::size_t peer = 0; peer < records.size(); ++peer) {
      auto& heard = group.heard[peer];
      if (!records[peer]) continue;
      if (!heard.seen || records[peer]->heartbeat != heard.heartbeat) {
        heard = {.seen = true, .heartbeat = records[peer]->heartbeat, .since_ns = now};
      }
    }
  }

  // How long a peer's heartbeat has stood still, once that is longer than a
  // live process's watchdog could miss: four periods, and at least a quarter
  // of the timeout (a busy machine delays a thread, never by that much).
  static std::optional<std::int64_t> silent_for(const group_watch& group, int peer, std::int64_t now) {
    const auto& heard = group.heard[static_cast<std::size_t>(peer)];
    if (!heard.seen) return std::nullopt;
    const auto limit = std::max(4 * period_of(group.timeout), group.timeout / 4);
    const std::int64_t silence = now - heard.since_ns;
    if (silence < std::chrono::duration_cast<std::chrono::nanoseconds>(limit).count()) return std::nullopt;
    return silence;
  }

  static std::string stopped_text(const group_watch& group, int peer, const peer_record& record,
                                  std::int64_t silence) {
    std::string who = "rank " + std::to_string(global_rank(group, peer)) + " (";
    if (!record.entries.empty()) {
      who += "it entered #" + std::to_string(record.entries.back().sequence) + " " + record.entries.back().describe() +
             ", but ";
    }
    return who + "its watchdog has not reported in the last " + seconds_text(silence) + ", where it reports every " +
           seconds_text(std::chrono::duration_cast<std::chrono::nanoseconds>(period_of(group.timeout)).count()) +
           ")";
  }

  static std::string behind_text(const group_watch& group, int peer, const std::optional<peer_record>& record) {
    std::string who = "rank " + std::to_string(global_rank(group, peer));
    // Records are published once per period: what a stopped rank reported
    // last may be up to a period old.
    if (!record) return who + " (it has reported nothing: it stopped before its watchdog first ran)";
    if (record->entries.empty()) return who + " (when it last reported, it had entered no collective of this group)";
    return who + " (when it last reported, it had last entered #" + std::to_string(record->entries.back().sequence) +
           " " + record->entries.back().describe() + ")";
  }

  static std::string joined(const std::vector<std::string>& parts) {
    std::string text;
    for (std::size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
    return text;
  }

  [[noreturn]] void decide(group_watch& group, const std::string& verdict) {
    bool announced = true;
    try {
      group.exchange->announce(verdict);
    } catch (const exchange_unanswered&) {
      announced = false;  // the others decide on their own
    }
    end(group, "loom watchdog: " + verdict, /*decided=*/announced);
  }

  [[noreturn]] void end(group_watch& group, const std::string& message, bool decided) {
    tell(message);
    // The decider leaves the others a couple of periods to read the verdict
    // and end with the same message before its launcher tears the job down.
    if (decided) std::this_thread::sleep_for(std::min(2 * period_ + std::chrono::milliseconds(100),
                                                      std::chrono::milliseconds(3000)));
    group.exchange->end_job(watchdog_exit_code);
    std::_Exit(watchdog_exit_code);  // end_job does not return; the compiler cannot see through the virtual
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::vector<std::weak_ptr<group_watch>> groups_;
  std::chrono::milliseconds period_{5000};
  bool stopping_ = false;
  bool warned_ = false;
  std::thread thread_;
};

}  // namespace

std::chrono::milliseconds effective_collective_timeout(std::chrono::milliseconds configured) {
  // At most 10^7 s (115 days): its milliseconds fit any clock's count.
  if (const auto seconds = cluster::setting_seconds("LOOM_COLLECTIVE_TIMEOUT", 1e7)) {
    return std::chrono::milliseconds(static_cast<std::int64_t>(std::llround(*seconds * 1000.0)));
  }
  return configured;
}

namespace {

// Gloo checks what arrives against what the op expects on its own I/O
// thread: a peer's collective of another size (an all_reduce of another
// shape) fails that check there, as gloo::EnforceNotMet, and an exception on
// that thread ends the process through std::terminate before any loom code
// can catch it (Gloo's own line says only "op.preamble.length <= op.nbytes.
// 4096 vs 4"). For Gloo's exceptions this handler first compares records
// as the error path does, for as long as a peer takes to publish its record
// (a watchdog period, 1 s more), and, when that finds a desync, prints the
// desync sentence and ends with the watchdog's status. Anything else goes to
// the previous handler unchanged.
std::terminate_handler previous_terminate = nullptr;

bool is_gloo_exception() {
  const std::type_info* type = abi::__cxa_current_exception_type();
  return type != nullptr && std::string_view(type->name()).find("gloo") != std::string_view::npos;
}

[[noreturn]] void explain_gloo_termination() {
  if (is_gloo_exception()) {
    for (const auto& group : watchdog_thread::instance().live()) {
      const auto patience = period_of(group->timeout) + std::chrono::seconds(1);
      if (auto desync = explain_desync(*group, patience)) {
        tell("loom watchdog (Gloo ended this rank on a size mismatch): " + *desync);
        std::_Exit(watchdog_exit_code);
      }
    }
  }
  if (previous_terminate != nullptr) previous_terminate();
  std::abort();
}

}  // namespace

void watch(const std::shared_ptr<group_watch>& group) {
  static std::once_flag installed;
  std::call_once(installed, [] { previous_terminate = std::set_terminate(&explain_gloo_termination); });
  watchdog_thread::instance().add(group);
}

std::string encode_record(const group_watch& group, bool paused) {
  std::ostringstream out;
  out << "loom-watchdog-2 " << group.recorder->entered() << ' ' << (paused ? 1 : 0) << ' '
      << group.heartbeat.load(std::memory_order_relaxed) << '\n';
  for (const auto& entry : group.recorder->recent(record_window)) {
    out << entry.sequence << ' ' << static_cast<int>(entry.kind) << ' ' << static_cast<int>(entry.dtype) << ' '
        << static_cast<int>(entry.rank);
    for (int d = 0; d < entry.rank; ++d) out << ' ' << entry.shape[static_cast<std::size_t>(d)];
    out << '\n';
  }
  return out.str();
}

std::optional<peer_record> decode_record(const std::string& text) {
  std::istringstream in(text);
  std::string magic;
  peer_record record;
  int paused = 0;
  if (!(in >> magic >> record.entered >> paused >> record.heartbeat) || magic != "loom-watchdog-2") return std::nullopt;
  record.paused = paused != 0;
  collective_entry entry;
  int kind = 0, dtype = 0, rank = 0;
  while (in >> entry.sequence >> kind >> dtype >> rank) {
    entry.kind = static_cast<collective_kind>(kind);
    entry.dtype = static_cast<std::int8_t>(dtype);
    entry.rank = static_cast<std::int8_t>(std::min(rank, collective_entry::max_rank));
    for (int d = 0; d < rank; ++d) in >> entry.shape[static_cast<std::size_t>(std::min(d, collective_entry::max_rank - 1))];
    record.entries.push_back(entry);
  }
  return record;
}

std::optional<std::string> explain_desync(group_watch& group, std::chrono::milliseconds patience) {
  try {
    group.exchange->publish(encode_record(group, pauses.load(std::memory_order_relaxed) > 0));
    const auto mine = group.recorder->recent(record_window);
    const auto deadline = std::chrono::steady_clock::now() + patience;
    for (;;) {
      bool waiting = false;
      for (int peer = 0; peer < group.size; ++peer) {
        if (peer == group.rank) continue;
        const auto record = record_of(group, peer);
        if (record) {
          if (auto desync = desync_with(group, peer, mine, *record)) return desync;
        }
        if (!record || record->entered < group.recorder->entered()) waiting = true;
      }
      if (!waiting || std::chrono::steady_clock::now() >= deadline) return std::nullopt;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  } catch (const std::exception&) {
    return std::nullopt;  // the exchange is gone too: the failure's own message stands
  }
}

watchdog_pause::watchdog_pause() { pauses.fetch_add(1, std::memory_order_relaxed); }
watchdog_pause::~watchdog_pause() { pauses.fetch_sub(1, std::memory_order_relaxed); }

}  // namespace loom::comm
