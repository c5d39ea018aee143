// Starts local ranks as child processes and watches them: when one fails,
// the others are ended (SIGTERM, then SIGKILL after a grace period) and the
// failure is reported with the rank and its exit status or signal. Children
// die with their parent (PR_SET_PDEATHSIG), so nothing is left behind when
// the launcher itself is killed. Used by loom-run and by fabric.launch().
// No torch headers.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace loom::launch {

using environment_update = std::vector<std::pair<std::string, std::string>>;

struct child {
  int local_rank = 0;
  pid_t pid = -1;
};

// How a job ended.
struct job_outcome {
  int exit_code = 0;               // 0 when every rank succeeded
  std::optional<int> failed_rank;  // the first rank that failed
  std::string description;         // "rank 1 (pid 123) was killed by signal 9 (Killed)"
};

class supervisor {
 public:
  explicit supervisor(std::chrono::milliseconds grace = std::chrono::seconds(2)) : grace_(grace) {}
  supervisor(const supervisor&) = delete;
  supervisor& operator=(const supervisor&) = delete;
  ~supervisor();  // ends children still running

  // Starts argv with the current environment plus `environment`.
  pid_t start(int local_rank, const std::vector<std::string>& argv, const environment_update& environment);

  // Watches a child this process forked itself.
  void adopt(int local_rank, pid_t pid);

  // Waits for every child (polling its own children only, so other children
  // of the process are not reaped). On the first failure the others are ended.
  job_outcome wait_all();
  // Sends signal to every child still running.
  void signal_all(int signal);
  // SIGTERM, then SIGKILL to those still alive after the grace period; reaps them.
  void terminate_all();

  const std::vector<child>& children() const noexcept { return children_; }
  bool running() const;

 private:
  std::chrono::milliseconds grace_;
  std::vector<child> children_;
  std::vector<bool> reaped_;
  bool own_groups_ = false;  // children started here lead their own process groups
};

// "exited with status 3", "was killed by signal 9 (Killed)".
std::string describe_status(int wait_status);
// The exit code a launcher reports for a child's wait status (128 + signal when killed).
int exit_code_of(int wait_status);

// The threads each of `processes` local ranks gets when the user has not
// set OMP_NUM_THREADS: the cores shared out, at least one (loom-run's rule;
// loom-bench gives its PyTorch peers the same).
unsigned threads_per_process(int processes);

// This process's command line (from /proc/self/cmdline) and executable, to
// start copies of it.
std::vector<std::string> own_command_line();
std::string own_executable();

// A new private (0700) directory for a FileStore, removed by remove_directory.
std::string make_private_directory(const std::string& prefix = "loom-rendezvous-");
void remove_directory(const std::string& path);

}  // namespace loom::launch
