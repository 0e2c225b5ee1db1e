// A child process for tests and benchmarks: started with posix_spawnp, its stdout read
// line by line, killed and reaped at the end of its scope. Free of Catch2 so that the
// benchmarks use it too: a failure to start throws.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

extern char** environ;

namespace test {

class Child {
 public:
  // Starts argv (argv[0] looked up on PATH) with this process's environment; stdin and
  // stderr are inherited, unless `quiet_stderr` sends stderr to /dev/null.
  explicit Child(const std::vector<std::string>& argv, bool quiet_stderr = false) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw std::runtime_error("pipe2 failed");
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    if (quiet_stderr) posix_spawn_file_actions_addopen(&fa, 2, "/dev/null", O_WRONLY, 0);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    int rc = ::posix_spawnp(&pid_, args[0], &fa, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&fa);
    ::close(fds[1]);
    if (rc != 0) {
      ::close(fds[0]);
      pid_ = -1;
      throw std::runtime_error("cannot start " + argv.front());
    }
    out_ = ::fdopen(fds[0], "r");
  }
  ~Child() {
    if (pid_ > 0) ::kill(pid_, SIGKILL), wait();
    if (out_) ::fclose(out_);
  }
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  // The next line of its stdout, without the newline; empty at end of output.
  std::string line() {
    char buf[512];
    if (!std::fgets(buf, sizeof buf, out_)) return {};
    std::string s(buf);
    if (!s.empty() && s.back() == '\n') s.pop_back();
    return s;
  }
  // The rest of its stdout, up to its end.
  std::string rest() {
    std::string out;
    char buf[4096];
    for (std::size_t n; (n = std::fread(buf, 1, sizeof buf, out_)) > 0;) out.append(buf, n);
    return out;
  }
  void kill(int sig) { ::kill(pid_, sig); }
  // Exit code, or -signal.
  int wait() {
    int status = 0;
    while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {}
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  }
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  FILE* out_ = nullptr;
};

}  // namespace test
