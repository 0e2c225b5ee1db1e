// Definitions of compile/runner.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/runner.hpp>

#include <fcntl.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>

#include <fmt/format.h>

extern char** environ;

namespace neffcache {

NEFFCACHE_DECL std::vector<std::string> RunAs::command(std::vector<std::string> argv) const {
  argv.insert(argv.begin(), {"setpriv", fmt::format("--reuid={}", uid), fmt::format("--regid={}", gid),
                             "--init-groups", "--"});
  return argv;
}

NEFFCACHE_DECL Result<RunAs> find_user(const std::string& user) {
  struct passwd pw {};
  struct passwd* found = nullptr;
  std::vector<char> buf(16384);
  uid_t uid = 0;
  auto [end, ec] = std::from_chars(user.data(), user.data() + user.size(), uid);
  const bool numeric = ec == std::errc() && end == user.data() + user.size();
  int err = numeric ? ::getpwuid_r(uid, &pw, buf.data(), buf.size(), &found)
                    : ::getpwnam_r(user.c_str(), &pw, buf.data(), buf.size(), &found);
  if (err != 0) return sys_error("look up user", user, err);
  if (!found) return Error{Errc::not_found, fmt::format("unknown user '{}'", user)};
  return RunAs{pw.pw_uid, pw.pw_gid, pw.pw_name};
}

namespace detail {

NEFFCACHE_DECL GroupGuard::GroupGuard(pid_t group) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return;
  UniqueFd read_end(fds[0]);
  write_end_ = UniqueFd(fds[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawn_file_actions_adddup2(&fa, read_end.get(), 3);
  posix_spawn_file_actions_addclosefrom_np(&fa, 4);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, all;
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  const std::string pgid = std::to_string(group);
  const char* argv[] = {"sh", "-c", "trap '' HUP INT TERM; read -r _ <&3; kill -s KILL -- -\"$1\"",
                        "neffcache-guard", pgid.c_str(), nullptr};
  if (::posix_spawn(&pid_, "/bin/sh", &fa, &attr, const_cast<char**>(argv), environ) != 0) pid_ = -1;
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
}

NEFFCACHE_DECL GroupGuard::~GroupGuard() {
  write_end_.reset();
  if (pid_ > 0) retry_eintr([&] { return static_cast<int>(::waitpid(pid_, nullptr, 0)); });
}

}  // namespace detail

NEFFCACHE_DECL Result<RunResult> PosixRunner::run(const RunSpec& spec) {
  using namespace std::chrono;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  if (spec.log_fd >= 0) {
    posix_spawn_file_actions_adddup2(&fa, spec.log_fd, 1);
    posix_spawn_file_actions_adddup2(&fa, spec.log_fd, 2);
  }
  // Nothing else of ours: a descriptor a library opens without close-on-exec (libcurl's
  // S3 connections and its wake-up socket pair) would live in the compiler for its whole
  // run, and keep a connection the daemon closed open. (dup2 onto itself clears
  // FD_CLOEXEC, glibc 2.29 and later.)
  int first_closed = 3;
  if (spec.inherit_fd >= 0) posix_spawn_file_actions_adddup2(&fa, spec.inherit_fd, first_closed++);
  posix_spawn_file_actions_addclosefrom_np(&fa, first_closed);
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
  const std::vector<std::string> argv = spec.run_as && !spec.argv.empty() ? spec.run_as->command(spec.argv) : spec.argv;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = -1;
  auto start = steady_clock::now();
  int err = args[0] ? ::posix_spawnp(&pid, args[0], &fa, &attr, args.data(), environ) : EINVAL;
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  if (err != 0) return sys_error("start compiler", spec.argv.empty() ? "" : spec.argv[0], err);
  std::optional<detail::GroupGuard> guard(std::in_place, pid);

  detail::UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  RunResult out;
  auto deadline = spec.timeout.count() > 0 ? start + spec.timeout : steady_clock::time_point::max();
  auto next_tick = start + spec.tick_interval;
  auto next_sample = start;  // the first look measures too
  steady_clock::time_point kill_at = steady_clock::time_point::max();
  bool stopping = false;
  for (;;) {
    // Exited? (WNOWAIT: the zombie keeps the group id ours until we have killed the
    // rest of the group below.)
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == pid) break;
    auto now = steady_clock::now();
    if (now >= next_sample) {
      // The whole group: compilers fork, and their children hold most of the memory.
      out.sampled_peak_kib = std::max(out.sampled_peak_kib, static_cast<long>(detail::group_rss_kib(pid)));
      next_sample = now + k_memory_sample_interval;
    }
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
    if (now >= kill_at) ::kill(-pid, SIGKILL), kill_at = now + k_memory_sample_interval;  // again, until it is gone
    // (A deadline or tick already passed, or not asked for, does not wake us: that would
    // spin through a kill grace.)
    auto wake = std::min(kill_at, next_sample);
    if (!stopping) wake = std::min({wake, deadline, spec.tick ? next_tick : wake});
    int ms = static_cast<int>(std::max<long>(1, duration_cast<milliseconds>(wake - now).count()));
    pollfd p{pidfd.get(), POLLIN, 0};
    if (pidfd) ::poll(&p, 1, ms);
    else ::usleep(static_cast<useconds_t>(std::min(ms, 20) * 1000));
  }
  ::kill(-pid, SIGKILL);  // no orphans: whatever the compiler left in its group
  guard.reset();          // before the compiler is reaped (see GroupGuard)
  int status = 0;
  struct rusage ru {};
  detail::retry_eintr([&] { return static_cast<int>(::wait4(pid, &status, 0, &ru)); });
  out.wall = duration_cast<milliseconds>(steady_clock::now() - start);
  out.peak_rss_kib = std::max(ru.ru_maxrss, out.sampled_peak_kib);
  if (out.end == RunEnd::exited) {
    if (WIFSIGNALED(status)) out.end = RunEnd::signaled, out.signal = WTERMSIG(status);
    else out.exit_code = WEXITSTATUS(status);
  }
  return out;
}

}  // namespace neffcache
