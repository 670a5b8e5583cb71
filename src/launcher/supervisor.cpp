// Process supervision for `dscpp launch`: fork+exec each child into its own process group, then one poll loop over a
// signalfd (SIGCHLD and the launcher's own signals) and optionally stdin, with a SIGKILL deadline once tearing down.
#include "dscpp/launcher/supervisor.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstring>
#include <stdexcept>

namespace dscpp::launcher {
namespace {

using Clock = std::chrono::steady_clock;

// Everything a child needs, prepared before fork: the child may only make async-signal-safe calls.
struct Prepared {
  std::vector<std::string> argv_storage, env_storage;
  std::vector<char*> argv, envp;
  std::string exec_error;  // "[dscpp launch] cannot execute 'prog': "
  cpu_set_t cpus;
  bool pin = false;
  int stdin_fd = -1, stdin_keep = -1, log_fd = -1;
};

struct Child {
  const ChildSpec* spec;
  pid_t pid = -1;
  bool alive = true;
  int stdin_keep = -1;  // the launcher's end of a stdin pipe, closed when the launch ends
};

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (auto& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

void prepare(const ChildSpec& spec, Prepared& p) {
  if (spec.argv.empty()) throw std::invalid_argument(spec.name + ": no program to run");
  p.argv_storage = spec.argv;
  for (const auto& [key, value] : spec.env) p.env_storage.push_back(key + "=" + value);
  p.argv = pointers(p.argv_storage);
  p.envp = pointers(p.env_storage);
  p.exec_error = "[dscpp launch] " + spec.name + ": cannot execute '" + spec.argv[0] + "': ";
  CPU_ZERO(&p.cpus);
  for (int cpu : spec.cpus) CPU_SET(cpu, &p.cpus);
  p.pin = !spec.cpus.empty();
  if (spec.stdin_pipe) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("cannot create a pipe: " + std::string(strerror(errno)));
    p.stdin_fd = fds[0];
    p.stdin_keep = fds[1];
  } else {
    p.stdin_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  if (!spec.log_path.empty()) {
    p.log_fd = ::open(spec.log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (p.log_fd < 0) {
      throw std::runtime_error("--enable_each_rank_log: cannot open '" + spec.log_path + "': " + strerror(errno));
    }
  }
}

[[noreturn]] void exec_child(Prepared& p, pid_t parent, const sigset_t& old_mask) {
  ::setpgid(0, 0);
  // If the launcher is SIGKILLed it cannot tear down; the kernel then sends the child SIGTERM instead.
  ::prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (::getppid() != parent) ::_exit(1);
  ::dup2(p.stdin_fd, STDIN_FILENO);
  if (p.log_fd >= 0) {
    ::dup2(p.log_fd, STDOUT_FILENO);
    ::dup2(p.log_fd, STDERR_FILENO);
  }
  if (p.pin) ::sched_setaffinity(0, sizeof(p.cpus), &p.cpus);
  ::sigprocmask(SIG_SETMASK, &old_mask, nullptr);
  ::execvpe(p.argv[0], p.argv.data(), p.envp.data());
  const char* reason = strerror(errno);
  [[maybe_unused]] ssize_t n = ::write(STDERR_FILENO, p.exec_error.data(), p.exec_error.size());
  n = ::write(STDERR_FILENO, reason, std::strlen(reason));
  n = ::write(STDERR_FILENO, "\n", 1);
  ::_exit(127);
}

int exit_code_of(int status) { return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status); }

std::string describe_exit(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  return "was killed by signal " + std::to_string(WTERMSIG(status)) + " (" + strsignal(WTERMSIG(status)) +
         "), code " + std::to_string(128 + WTERMSIG(status));
}

void signal_all(std::vector<Child>& children, int sig) {
  for (auto& child : children) {
    if (child.alive) ::kill(-child.pid, sig);
  }
}

// Saved and restored around the run: the signals the loop receives through its signalfd.
class SignalScope {
 public:
  SignalScope() {
    sigemptyset(&set_);
    for (int sig : {SIGCHLD, SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction current {};
      ::sigaction(sig, nullptr, &current);
      // An ignored SIGHUP (nohup) stays ignored; an ignored SIGINT/SIGTERM (a shell's background job) would never
      // reach the signalfd, and an ignored SIGCHLD would auto-reap the children — so those get their default back.
      if (sig == SIGHUP && current.sa_handler == SIG_IGN) continue;
      saved_.push_back({sig, current});
      struct sigaction dfl {};
      dfl.sa_handler = SIG_DFL;
      ::sigaction(sig, &dfl, nullptr);
      sigaddset(&set_, sig);
    }
    ::sigprocmask(SIG_BLOCK, &set_, &old_mask_);
    fd_ = ::signalfd(-1, &set_, SFD_CLOEXEC | SFD_NONBLOCK);
    if (fd_ < 0) throw std::runtime_error("signalfd failed: " + std::string(strerror(errno)));
  }
  ~SignalScope() {
    ::close(fd_);
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    for (auto& [sig, action] : saved_) ::sigaction(sig, &action, nullptr);
  }
  int fd() const { return fd_; }
  const sigset_t& old_mask() const { return old_mask_; }

 private:
  sigset_t set_, old_mask_;
  std::vector<std::pair<int, struct sigaction>> saved_;
  int fd_ = -1;
};

}  // namespace

SupervisionResult supervise(const std::vector<ChildSpec>& specs, const SupervisorOptions& options,
                            std::ostream& err) {
  SignalScope signals;
  std::vector<Child> children;
  bool stopping = false, killed = false;
  SupervisionResult result;
  int& exit_code = result.exit_code;
  Clock::time_point kill_at;
  const auto teardown = [&](int sig) {
    stopping = true;
    kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(options.grace_seconds));
    signal_all(children, sig);
  };
  const auto reap = [&](bool blocking) {
    for (auto& child : children) {
      int status = 0;
      if (!child.alive || ::waitpid(child.pid, &status, blocking ? 0 : WNOHANG) <= 0) continue;
      child.alive = false;
      const int code = exit_code_of(status);
      if (code != 0 && !stopping) {
        err << "[dscpp launch] " << child.spec->name << " (pid " << child.pid << ") " << describe_exit(status)
            << "; terminating the other " << options.others << std::endl;
        exit_code = code;
        teardown(SIGTERM);
      }
    }
  };

  for (const ChildSpec& spec : specs) {
    Prepared p;
    try {
      prepare(spec, p);
    } catch (...) {
      for (int fd : {p.stdin_fd, p.stdin_keep, p.log_fd}) if (fd >= 0) ::close(fd);
      stopping = killed = true;
      signal_all(children, SIGKILL);
      reap(true);
      for (auto& child : children) if (child.stdin_keep >= 0) ::close(child.stdin_keep);
      throw;
    }
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) exec_child(p, parent, signals.old_mask());
    for (int fd : {p.stdin_fd, p.log_fd}) if (fd >= 0) ::close(fd);
    if (pid < 0) {
      if (p.stdin_keep >= 0) ::close(p.stdin_keep);
      stopping = killed = true;
      signal_all(children, SIGKILL);
      reap(true);
      throw std::runtime_error("cannot start " + spec.name + ": fork failed: " + strerror(errno));
    }
    ::setpgid(pid, pid);  // also in the child: whichever runs first, the group exists before any kill
    children.push_back({&spec, pid, true, p.stdin_keep});
  }

  bool watch_stdin = options.watch_stdin;
  const auto alive = [&] {
    for (const auto& child : children) if (child.alive) return true;
    return false;
  };
  const auto on_launcher_signal = [&](int sig, const std::string& why) {
    result.stopped = true;  // also during a teardown after a failure: no restart once the launcher is told to stop
    if (stopping) {  // a second Ctrl-C: no more grace
      if (!killed) signal_all(children, SIGKILL);
      killed = true;
      return;
    }
    err << "[dscpp launch] " << why << "; stopping the " << options.others << std::endl;
    exit_code = 128 + sig;
    teardown(sig == SIGINT ? SIGINT : SIGTERM);
  };
  while (alive()) {
    int timeout_ms = -1;
    if (stopping && !killed) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(kill_at - Clock::now()).count();
      timeout_ms = static_cast<int>(std::max<int64_t>(left, 0));
    }
    pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {STDIN_FILENO, POLLIN, 0}};
    const int ready = ::poll(fds, watch_stdin ? 2 : 1, timeout_ms);
    if (ready < 0 && errno != EINTR) throw std::runtime_error("poll failed: " + std::string(strerror(errno)));
    if (ready > 0 && (fds[0].revents & POLLIN)) {
      signalfd_siginfo info;
      while (::read(signals.fd(), &info, sizeof(info)) == static_cast<ssize_t>(sizeof(info))) {
        const int sig = static_cast<int>(info.ssi_signo);
        if (sig != SIGCHLD) {
          on_launcher_signal(sig, "received signal " + std::to_string(sig) + " (" + strsignal(sig) + ")");
        }
      }
    }
    if (ready > 0 && watch_stdin && (fds[1].revents & (POLLIN | POLLHUP | POLLERR))) {
      char buffer[256];
      if (::read(STDIN_FILENO, buffer, sizeof(buffer)) <= 0) {
        watch_stdin = false;
        on_launcher_signal(SIGTERM, "stdin closed (the launcher that started this node is gone)");
      }
    }
    reap(false);
    if (stopping && !killed && Clock::now() >= kill_at && alive()) {
      err << "[dscpp launch] some " << options.others << " ignored SIGTERM for " << options.grace_seconds
          << " s; sending SIGKILL" << std::endl;
      signal_all(children, SIGKILL);
      killed = true;
    }
  }
  // Grandchildren of a torn-down child may outlive it in its process group: no orphans.
  if (stopping) {
    for (auto& child : children) ::kill(-child.pid, SIGKILL);
  }
  for (auto& child : children) if (child.stdin_keep >= 0) ::close(child.stdin_keep);
  return result;
}

}  // namespace dscpp::launcher
