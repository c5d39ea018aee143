#include <loom/errors.hpp>
#include <loom/util/process_state.hpp>
#include <loom/launch/supervisor.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace loom::launch {

std::string describe_status(int wait_status) {
  if (WIFEXITED(wait_status)) return "exited with status " + std::to_string(WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) {
    const int sig = WTERMSIG(wait_status);
    const char* name = ::strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  return "stopped";
}

int exit_code_of(int wait_status) {
  if (WIFEXITED(wait_status)) return WEXITSTATUS(wait_status);
  if (WIFSIGNALED(wait_status)) return 128 + WTERMSIG(wait_status);
  return 1;
}

pid_t supervisor::start(int local_rank, const std::vector<std::string>& argv, const environment_update& environment) {
  if (argv.empty()) throw std::invalid_argument("supervisor::start: empty command");
  // Build everything before fork: only async-signal-safe calls in the child.
  std::vector<std::string> env_strings;
  for (char** entry = environ; *entry != nullptr; ++entry) {
    const std::string text(*entry);
    const auto name = text.substr(0, text.find('='));
    bool replaced = false;
    for (const auto& [key, value] : environment) replaced = replaced || key == name;
    if (!replaced) env_strings.push_back(text);
  }
  for (const auto& [key, value] : environment) env_strings.push_back(key + "=" + value);
  std::vector<char*> env_pointers;
  for (auto& text : env_strings) env_pointers.push_back(text.data());
  env_pointers.push_back(nullptr);
  std::vector<std::string> args = argv;
  std::vector<char*> arg_pointers;
  for (auto& arg : args) arg_pointers.push_back(arg.data());
  arg_pointers.push_back(nullptr);
  const pid_t parent = ::getpid();

  // A pipe that closes on a successful exec, and carries errno when exec fails.
  int report[2];
  if (::pipe2(report, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe2: ") + std::strerror(errno));
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(report[0]);
    ::close(report[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(report[0]);
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(127);  // the parent died before prctl
    // Its own process group, so that ending a rank ends what it started too
    // (a shell's children, say).
    ::setpgid(0, 0);
    ::signal(SIGINT, SIG_DFL);
    ::signal(SIGTERM, SIG_DFL);
    ::execvpe(arg_pointers[0], arg_pointers.data(), env_pointers.data());
    const int error = errno;
    (void)!::write(report[1], &error, sizeof(error));
    ::_exit(127);
  }
  ::close(report[1]);
  int exec_error = 0;
  ssize_t got = 0;
  do {
    got = ::read(report[0], &exec_error, sizeof(exec_error));
  } while (got < 0 && errno == EINTR);
  ::close(report[0]);
  if (got > 0) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    throw configuration_error("cannot start '" + argv[0] + "' for local rank " + std::to_string(local_rank) + ": " +
                              std::strerror(exec_error));
  }
  ::setpgid(pid, pid);  // also here: whichever of parent and child runs first
  own_groups_ = true;
  children_.push_back({local_rank, pid});
  reaped_.push_back(false);
  return pid;
}

namespace {
// Whether pid is stopped by a signal ('T') or traced ('t').
bool is_stopped(pid_t pid) {
  const char state = detail::process_state(pid);
  return state == 'T' || state == 't';
}
}  // namespace

bool supervisor::running() const {
  for (std::size_t i = 0; i < children_.size(); ++i) {
    if (!reaped_[i]) return true;
  }
  return false;
}

void supervisor::signal_all(int signal) {
  for (std::size_t i = 0; i < children_.size(); ++i) {
    if (reaped_[i]) continue;
    // The child's process group when it leads one (children started here do),
    // else the child alone (adopted, forked ones).
    if (::getpgid(children_[i].pid) == children_[i].pid) ::kill(-children_[i].pid, signal);
    else ::kill(children_[i].pid, signal);
  }
}

void supervisor::terminate_all() {
  signal_all(SIGTERM);
  // A stopped rank (kill -STOP, a debugger, the watchdog's "stuck" case)
  // keeps SIGTERM pending and would only go at the end of the grace period:
  // it gets SIGKILL now.
  for (std::size_t i = 0; i < children_.size(); ++i) {
    if (reaped_[i] || !is_stopped(children_[i].pid)) continue;
    if (::getpgid(children_[i].pid) == children_[i].pid) ::kill(-children_[i].pid, SIGKILL);
    else ::kill(children_[i].pid, SIGKILL);
  }
  const auto deadline = std::chrono::steady_clock::now() + grace_;
  while (running()) {
    for (std::size_t i = 0; i < children_.size(); ++i) {
      if (reaped_[i]) continue;
      int status = 0;
      const pid_t done = ::waitpid(children_[i].pid, &status, WNOHANG);
      if (done == children_[i].pid || (done < 0 && errno == ECHILD)) reaped_[i] = true;
    }
    if (!running()) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      signal_all(SIGKILL);
      for (std::size_t i = 0; i < children_.size(); ++i) {
        if (reaped_[i]) continue;
        int status = 0;
        while (::waitpid(children_[i].pid, &status, 0) < 0 && errno == EINTR) {
        }
        reaped_[i] = true;
      }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

void supervisor::adopt(int local_rank, pid_t pid) {
  children_.push_back({local_rank, pid});
  reaped_.push_back(false);
}

job_outcome supervisor::wait_all() {
  job_outcome outcome;
  while (running()) {
    bool any = false;
    for (std::size_t i = 0; i < children_.size(); ++i) {
      if (reaped_[i]) continue;
      int status = 0;
      const pid_t pid = ::waitpid(children_[i].pid, &status, WNOHANG);
      if (pid == 0) continue;
      if (pid < 0) {
        if (errno == EINTR) continue;
        reaped_[i] = true;  // ECHILD: reaped elsewhere
        continue;
      }
      any = true;
      reaped_[i] = true;
      // What the rank started may outlive it; its process group goes with it.
      if (own_groups_) ::kill(-children_[i].pid, SIGKILL);
      const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
      if (failed && !outcome.failed_rank) {
        outcome.failed_rank = children_[i].local_rank;
        outcome.exit_code = exit_code_of(status);
        outcome.description = "local rank " + std::to_string(children_[i].local_rank) + " (pid " +
                              std::to_string(pid) + ") " + describe_status(status);
        terminate_all();
      }
    }
    if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return outcome;
}

supervisor::~supervisor() {
  if (running()) terminate_all();
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> args;
  std::string current;
  for (char c : all) {
    if (c == '\0') {
      args.push_back(current);
      current.clear();
    } else {
      current += c;
    }
  }
  if (!current.empty()) args.push_back(current);
  return args;
}

unsigned threads_per_process(int processes) {
  const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
  return std::max(1U, cores / static_cast<unsigned>(std::max(1, processes)));
}

std::string own_executable() { return std::filesystem::read_symlink("/proc/self/exe").string(); }

std::string make_private_directory(const std::string& prefix) {
  std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    throw std::runtime_error("cannot create a private directory from " + pattern + ": " + std::strerror(errno));
  }
  ::chmod(pattern.c_str(), 0700);  // mkdtemp already makes it 0700; say so explicitly
  return pattern;
}

void remove_directory(const std::string& path) {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

}  // namespace loom::launch
