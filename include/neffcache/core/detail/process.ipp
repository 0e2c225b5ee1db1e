// Definitions of core/detail/process.hpp (core/decl.hpp).
#pragma once

#include <neffcache/core/detail/process.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace neffcache::detail {

NEFFCACHE_DECL Result<Captured> run_capture(const std::vector<std::string>& argv,
                                            std::chrono::milliseconds timeout) {
  int pipefd[2];
  if (::pipe2(pipefd, O_CLOEXEC) != 0) return sys_error("pipe", argv[0]);
  UniqueFd rd(pipefd[0]), wr(pipefd[1]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 1);
  posix_spawn_file_actions_adddup2(&fa, wr.get(), 2);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid;
  int err = ::posix_spawnp(&pid, args[0], &fa, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) return sys_error("run", argv[0], err);
  wr.reset();

  Captured out;
  auto deadline = std::chrono::steady_clock::now() + timeout;
  bool timed_out = false;
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{rd.get(), POLLIN, 0};
    int n = ::poll(&p, 1, static_cast<int>(left.count()));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) continue;
    char buf[4096];
    ssize_t got = retry_eintr([&] { return ::read(rd.get(), buf, sizeof buf); });
    if (got <= 0) break;
    out.output.append(buf, static_cast<std::size_t>(got));
  }
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  retry_eintr([&] { return static_cast<int>(::waitpid(pid, &status, 0)); });
  if (timed_out) return sys_error("run", argv[0], ETIMEDOUT);
  out.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

}  // namespace neffcache::detail
