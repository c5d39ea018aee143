// The collective watchdog: one thread per process that notices a rank waiting
// in a collective longer than collective_timeout, compares what every rank of
// the group has entered, and ends the job with one message naming the ranks
// that have not entered it (stuck, or too slow), or the two ops when ranks
// entered different collectives at the same sequence number (desync).
//
// Each rank publishes its record (entered count, last few entries, and a
// heartbeat that counts the watchdog's looks) once per period; nothing is
// exchanged on the hot path. The heartbeat tells a peer stopped inside the
// collective (kill -STOP, a hung process) from a collective that is long.
// Where the records meet is an exchange: the group's store, or, for the MPI
// group (which has none), a duplicated communicator. Not installed.
#pragma once

#include "collective_recorder.hpp"

#include <chrono>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace loom::comm {

// The exit status of every rank the watchdog ends.
inline constexpr int watchdog_exit_code = 70;

// An exchange call that got no answer in time: the process that serves the
// exchange (a TCPStore's server runs in global rank 0) is stopped or gone.
// what() says who, for how long: "rank 0, which hosts the rendezvous store,
// has not answered for 2.1 s".
struct exchange_unanswered : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where the ranks' records meet. Called from the watchdog thread only (and
// from a failing collective's error path).
class watchdog_exchange {
 public:
  virtual ~watchdog_exchange() = default;
  virtual void publish(const std::string& record) = 0;
  // The latest record `rank` published, if any reached this rank.
  virtual std::optional<std::string> record_of(int rank) = 0;
  // The job's verdict: announced once by the rank that decided; every rank's
  // watchdog looks for it each period.
  virtual void announce(const std::string& verdict) = 0;
  virtual std::optional<std::string> verdict() = 0;
  // Ends this process (or, for MPI, the job).
  [[noreturn]] virtual void end_job(int exit_code) = 0;
};

struct group_watch {
  std::shared_ptr<collective_recorder> recorder;
  std::unique_ptr<watchdog_exchange> exchange;
  std::chrono::milliseconds timeout{0};
  std::string group_name;
  int rank = 0;
  int size = 1;
  std::vector<int> global_ranks;
  // This rank's heartbeat: the watchdog's looks so far (read by the error
  // path's explain_desync too).
  std::atomic<std::uint64_t> heartbeat{0};
  // The watchdog thread's own bookkeeping: when each peer's heartbeat last
  // moved, as this rank saw it, from half the timeout into a wait on.
  struct heard_from {
    bool seen = false;
    std::uint64_t heartbeat = 0;
    std::int64_t since_ns = 0;
  };
  std::vector<heard_from> heard;
};

// collective_timeout from the options, unless LOOM_COLLECTIVE_TIMEOUT
// (seconds; 0 turns the watchdog off) overrides it.
std::chrono::milliseconds effective_collective_timeout(std::chrono::milliseconds configured);

// Starts watching (the thread starts with the first group).
void watch(const std::shared_ptr<group_watch>& group);

// After a collective failed: if the ranks' records show a desynchronisation,
// the sentence that names both ops (waits up to `patience` for peers that
// have not reported that far).
std::optional<std::string> explain_desync(group_watch& group, std::chrono::milliseconds patience);

// The record the exchange carries, and its reading.
std::string encode_record(const group_watch& group, bool paused);
struct peer_record {
  std::uint64_t entered = 0;
  bool paused = false;
  std::uint64_t heartbeat = 0;
  std::vector<collective_entry> entries;  // the last few, oldest first
};
std::optional<peer_record> decode_record(const std::string& text);

}  // namespace loom::comm
