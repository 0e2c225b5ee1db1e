// Running a compiler: its own process group, output into a log, a deadline enforced on
// the whole group (TERM, then KILL), the peak memory of the whole group recorded (compilers
// fork), and no process of the group outliving the thread that started it (a killed daemon
// leaves no compiler behind).
// Behind an interface so that schedulers can be tested with a fake runner.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// How often a running compiler's process group is measured (one scan of /proc each).
// Also the longest the runner sleeps between looks at its child.
inline constexpr std::chrono::milliseconds k_memory_sample_interval{100};

// A user to run a child as; the caller must be root. posix_spawn cannot change ids, so
// setpriv (util-linux) does it between the spawn and the exec, in the same process: the
// process group, the inherited descriptors and the timeout apply as without it.
struct RunAs {
  uid_t uid = 0;
  gid_t gid = 0;  // the user's primary group; its other groups come with it
  std::string name;

  // `argv` run as this user, through setpriv (which must be on PATH).
  std::vector<std::string> command(std::vector<std::string> argv) const;
};

// A user by name or number, from the user database. Unknown users are errors.
NEFFCACHE_DECL Result<RunAs> find_user(const std::string& user);

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
  // Kept open in the child as descriptor 3 (not owned). For the entry lock: its kernel
  // lock then lasts as long as the compiler does, even past our own death. The child gets
  // no other descriptor but stdio.
  int inherit_fd = -1;
  std::optional<RunAs> run_as;  // run as this user (setpriv must be on PATH)
};

enum class RunEnd { exited, signaled, timed_out, cancelled };

struct RunResult {
  RunEnd end = RunEnd::exited;
  int exit_code = 0;  // RunEnd::exited
  int signal = 0;     // RunEnd::signaled
  std::chrono::milliseconds wall{0};
  // The peak resident memory of the compiler's process tree: the larger of the child's
  // ru_maxrss (its own peak, or that of the largest descendant it reaped, whichever is
  // larger) and sampled_peak_kib. Processes that held memory at the same time count
  // together only through the samples.
  long peak_rss_kib = 0;
  // The largest sum of the resident memory of every process in the child's process group
  // seen by sampling it every k_memory_sample_interval while it ran (0: no sample taken,
  // or a runner that does not sample). A peak shorter than the interval may be missed.
  long sampled_peak_kib = 0;
};

class ProcessRunner {
 public:
  virtual ~ProcessRunner() = default;
  // Errors only when the child could not be started (Errc::not_found for a program
  // missing from PATH); everything that happens to a started child is a RunResult.
  virtual Result<RunResult> run(const RunSpec& spec) = 0;
};

namespace detail {

// A guard of a compiler's process group: a shell that waits on a pipe whose write end
// only this process holds (close-on-exec), and kills the group when the pipe ends. The
// runner ends it when it is done with the compiler; the kernel ends it when this process
// dies, however it dies. Compilers run in a group of their own, which no signal to us
// reaches, so without a guard a daemon killed by SIGKILL (or a tool by Ctrl-C) would
// leave its compilers running beside the compiles of whoever takes the entries over.
// (Not a fork of this process: libfuse answers reads by vmsplice of a header that it
// completes afterwards, and a fork in between turns that page copy-on-write under it.)
class GroupGuard {
 public:
  explicit GroupGuard(pid_t group);
  // Kills the group (if anything of it is left) and reaps the guard. Call it before the
  // group's leader is reaped: until then the group's id cannot be another group's.
  ~GroupGuard();
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;

 private:
  UniqueFd write_end_;
  pid_t pid_ = -1;
};

}  // namespace detail

class PosixRunner final : public ProcessRunner {
 public:
  Result<RunResult> run(const RunSpec& spec) override;
};

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/runner.ipp>
#endif
