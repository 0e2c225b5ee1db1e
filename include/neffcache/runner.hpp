// Running a compiler: its own process group, output into a log, a deadline enforced on
// the whole group (TERM, then KILL), peak memory recorded, and no process of the group
// outliving the thread that started it (a killed daemon leaves no compiler behind).
// Behind an interface so that schedulers can be tested with a fake runner.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include <neffcache/detail/fs.hpp>
#include <neffcache/result.hpp>

extern char** environ;

namespace neffcache {

struct RunSpec {
  std::vector<std::string> argv;  // argv[0] is looked up on PATH
  std::string cwd;                // working directory of the child
  int log_fd = -1;                // receives stdout and stderr; not owned
  std::chrono::milliseconds timeout{0};  // 0: none
  std::chrono::milliseconds kill_grace{10'000};  // after SIGTERM, before SIGKILL
  // Called about every tick_interval while the child runs; returning false stops it
  // like a timeout does (RunEnd::cancelled).
  std::function<bool()> tick;
  std::chrono::milliseconds tick_interval{1000};
  // Kept open in the child at the same number (not owned). For the entry lock: its
  // kernel lock then lasts as long as the compiler does, even past our own death.
  int inherit_fd = -1;
};

enum class RunEnd { exited, signaled, timed_out, cancelled };

struct RunResult {
  RunEnd end = RunEnd::exited;
  int exit_code = 0;  // RunEnd::exited
  int signal = 0;     // RunEnd::signaled
  std::chrono::milliseconds wall{0};
  long peak_rss_kib = 0;  // the child's peak resident memory
};

class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  // Errors only when the child could not be started (Errc::not_found for a program
  // missing from PATH); everything that happens to a started child is a RunResult.
  virtual Result<RunResult> run(const RunSpec& spec) = 0;
};

namespace detail {

// Starts a guard of the process group `group`: a forked copy of this process that waits
// for the calling thread to die and then kills the group. Compilers run in a group of
// their own, which no signal to us reaches, so without it a daemon killed by SIGKILL (or
// a tool by Ctrl-C) would leave its compilers running beside the compiles of whoever
// takes the entries over. The guard closes every descriptor and only waits. Returns its
// pid, or -1 when fork() failed (the compile then runs unguarded).
inline pid_t start_group_guard(pid_t group) {
  const pid_t parent = ::getpid();
  sigset_t all, usr1;
  sigfillset(&all);
  sigemptyset(&usr1);
  sigaddset(&usr1, SIGUSR1);
  // Blocked across fork(), so that no handler of ours ever runs in the guard.
  sigset_t old;
  ::pthread_sigmask(SIG_SETMASK, &all, &old);
  const pid_t guard = ::fork();
  if (guard != 0) {
    ::pthread_sigmask(SIG_SETMASK, &old, nullptr);
    return guard;
  }
  // The guard: async-signal-safe calls only from here on.
  ::close_range(0, ~0U, 0);
  ::prctl(PR_SET_NAME, "neffcache-guard");
  // SIGUSR1 when the thread that forked us ends. The thread that runs a compiler lives
  // until it has reaped it, and it kills this guard itself afterwards.
  ::prctl(PR_SET_PDEATHSIG, SIGUSR1);
  // Our parent died before the prctl, or a stray SIGUSR1 came: getppid() tells.
  while (::getppid() == parent) ::sigwaitinfo(&usr1, nullptr);
  ::kill(-group, SIGKILL);
  ::_exit(0);
}

}  // namespace detail

class PosixRunner final : public ProcessRunner {
 public:
  Result<RunResult> run(const RunSpec& spec) override {
    using namespace std::chrono;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    if (spec.log_fd >= 0) {
      posix_spawn_file_actions_adddup2(&fa, spec.log_fd, 1);
      posix_spawn_file_actions_adddup2(&fa, spec.log_fd, 2);
    }
    // dup2 onto itself clears FD_CLOEXEC (glibc 2.29 and later).
    if (spec.inherit_fd >= 0) posix_spawn_file_actions_adddup2(&fa, spec.inherit_fd, spec.inherit_fd);
    if (!spec.cwd.empty()) posix_spawn_file_actions_addchdir_np(&fa, spec.cwd.c_str());
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // A group of its own, so a timeout reaches every process the compiler started;
    // default signal handling and an empty mask, whatever the caller had.
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setpgroup(&attr, 0);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    std::vector<char*> args;
    for (const auto& a : spec.argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = -1;
    auto start = steady_clock::now();
    int err = args[0] ? ::posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ) : EINVAL;
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    if (err != 0) return sys_error("start compiler", spec.argv.empty() ? "" : spec.argv[0], err);
    const pid_t guard = detail::start_group_guard(pid);

    detail::UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
    RunResult out;
    auto deadline = spec.timeout.count() > 0 ? start + spec.timeout : steady_clock::time_point::max();
    auto next_tick = start + spec.tick_interval;
    steady_clock::time_point kill_at = steady_clock::time_point::max();
    bool stopping = false;
    for (;;) {
      // Exited? (WNOWAIT: the zombie keeps the group id ours until we have killed the
      // rest of the group below.)
      siginfo_t info{};
      if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) break;
      auto now = steady_clock::now();
      if (!stopping && (now >= deadline)) {
        out.end = RunEnd::timed_out;
        stopping = true;
      }
      if (!stopping && spec.tick && now >= next_tick) {
        next_tick = now + spec.tick_interval;
        if (!spec.tick()) out.end = RunEnd::cancelled, stopping = true;
      }
      if (stopping && kill_at == steady_clock::time_point::max()) {
        ::kill(-pid, SIGTERM);
        kill_at = now + spec.kill_grace;
      }
      if (now >= kill_at) ::kill(-pid, SIGKILL);
      auto wake = std::min({next_tick, deadline, kill_at, now + milliseconds(200)});
      int ms = static_cast<int>(std::max<long>(1, duration_cast<milliseconds>(wake - now).count()));
      pollfd p{pidfd.get(), POLLIN, 0};
      if (pidfd) ::poll(&p, 1, ms);
      else ::usleep(static_cast<useconds_t>(std::min(ms, 20) * 1000));
    }
    ::kill(-pid, SIGKILL);  // no orphans: whatever the compiler left in its group
    // The guard goes before the compiler is reaped: until then the group's id cannot be
    // another group's, so the guard can never kill strangers.
    if (guard > 0) {
      ::kill(guard, SIGKILL);
      detail::retry_eintr([&] { return static_cast<int>(::waitpid(guard, nullptr, 0)); });
    }
    int status = 0;
    struct rusage ru {};
    detail::retry_eintr([&] { return static_cast<int>(::wait4(pid, &status, 0, &ru)); });
    out.wall = duration_cast<milliseconds>(steady_clock::now() - start);
    out.peak_rss_kib = ru.ru_maxrss;
    if (out.end == RunEnd::exited) {
      if (WIFSIGNALED(status)) out.end = RunEnd::signaled, out.signal = WTERMSIG(status);
      else out.exit_code = WEXITSTATUS(status);
    }
    return out;
  }
};

}  // namespace neffcache
