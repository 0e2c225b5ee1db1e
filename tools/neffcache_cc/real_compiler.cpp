// The real compiler (shim.hpp).
#include "shim.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <vector>

#include <fmt/format.h>

#include <neffcache/cache/key.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/env.hpp>

namespace neffcache::shim {

namespace fs = std::filesystem;

std::string real_path(const std::string& p) {
  std::error_code ec;
  auto r = fs::canonical(p, ec);
  return ec ? std::string() : r.string();
}

namespace {

bool executable_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

}  // namespace

Result<std::string> find_real_compiler(const std::string& self) {
  auto is_self = [&](const std::string& p) { return !self.empty() && real_path(p) == self; };
  auto on_path = [&](const std::string& name) -> std::optional<std::string> {
    const std::string path_var = process_env("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
    std::string_view path = path_var;
    while (true) {
      auto colon = path.find(':');
      std::string_view dir = path.substr(0, colon);
      const std::string candidate = fmt::format("{}/{}", dir.empty() ? std::string_view(".") : dir, name);
      if (executable_file(candidate) && !is_self(candidate)) return candidate;
      if (colon == std::string_view::npos) return std::nullopt;
      path.remove_prefix(colon + 1);
    }
  };
  if (auto given = process_env("NEFFCACHE_REAL_COMPILER"); given && !given->empty()) {
    std::optional<std::string> found = given->find('/') != std::string::npos
                                           ? (executable_file(*given) ? std::optional(*given) : std::nullopt)
                                           : on_path(*given);
    if (!found) return Error{Errc::not_found, fmt::format("NEFFCACHE_REAL_COMPILER={}: no such program", *given)};
    if (is_self(*found))
      return Error{Errc::invalid_argument, fmt::format("NEFFCACHE_REAL_COMPILER={} is {} itself", *given, k_me)};
    return *found;
  }
  if (auto found = on_path(k_compiler_name)) return *found;
  return Error{Errc::not_found,
               fmt::format("no real {} on PATH besides this one (set NEFFCACHE_REAL_COMPILER)", k_compiler_name)};
}

namespace {

std::vector<int> open_descriptors() {
  std::vector<int> fds;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc/self/fd", ec)) fds.push_back(std::atoi(e.path().filename().c_str()));
  // (Without the listing's own descriptor, closed by now.)
  std::erase_if(fds, [](int fd) { return ::fcntl(fd, F_GETFD) < 0; });
  std::sort(fds.begin(), fds.end());
  return fds;
}

std::vector<int>& inherited() {
  static std::vector<int> fds;
  return fds;
}

// Every descriptor opened since note_inherited_descriptors closes at an exec.
void close_ours_on_exec() {
  for (int fd : open_descriptors())
    if (!std::binary_search(inherited().begin(), inherited().end(), fd))
      if (int flags = ::fcntl(fd, F_GETFD); flags >= 0) ::fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
}

}  // namespace

void note_inherited_descriptors() { inherited() = open_descriptors(); }

[[noreturn]] void exec_real(const std::string& real, int argc, char** argv) {
  close_ours_on_exec();
  std::vector<char*> args{const_cast<char*>(real.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(real.c_str(), args.data());
  fmt::print(stderr, "{}: error: cannot run {}: {}\n", k_me, real, std::strerror(errno));
  std::exit(127);
}

[[noreturn]] void run_without_cache(const std::string& real, int argc, char** argv, std::string_view why) {
  fmt::print(stderr, "{}: warning: {}; running {} without the cache\n", k_me, why, real);
  exec_real(real, argc, argv);
}

int run_real(const std::string& real, int argc, char** argv, int inherit_fd) {
  std::vector<char*> args{const_cast<char*>(real.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  // Written before the fork: the child of a process with a thread (KeepAlive) calls only
  // what is safe after a fork (close_range, fcntl, execv, write, _exit).
  const std::string cannot_run = fmt::format("{}: error: cannot run {}: ", k_me, real);
  // What the child keeps: the descriptors we were started with, and `inherit_fd`. The rest
  // are closed in the child (close_range, safe after a fork): a thread of ours (KeepAlive's
  // lease renewals) may open one between here and the fork.
  std::vector<int> keep = inherited();
  if (inherit_fd >= 0) keep.insert(std::upper_bound(keep.begin(), keep.end(), inherit_fd), inherit_fd);
  const pid_t pid = ::fork();
  if (pid < 0) {
    fmt::print(stderr, "{}: error: fork: {}\n", k_me, std::strerror(errno));
    return 127;
  }
  if (pid == 0) {
    unsigned from = 3;
    for (int fd : keep) {
      if (fd < 3) continue;
      if (static_cast<unsigned>(fd) > from) ::close_range(from, static_cast<unsigned>(fd) - 1, 0);
      from = static_cast<unsigned>(fd) + 1;
    }
    ::close_range(from, ~0U, 0);
    if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);
    ::execv(real.c_str(), args.data());
    const char* why = ::strerrordesc_np(errno);  // (glibc's strerror without the locale: safe here)
    (void)!::write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
    if (why) (void)!::write(STDERR_FILENO, why, std::strlen(why));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

Result<std::string> compiler_version(const std::string& real, const std::string& state) {
  struct stat st {};
  const std::string resolved = real_path(real);
  if (resolved.empty() || ::stat(resolved.c_str(), &st) != 0) return sys_error("stat", real);
  const std::string id = detail::xxh3_hex(detail::xxh3_64(fmt::format(
      "{}|{}|{}|{}|{}|{}", resolved, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec)));
  const std::string memo = fmt::format("{}/compilers/{}", state, id);
  if (auto text = detail::read_file(memo); text && check_compiler_version(*text)) return *text;
  auto v = detect_compiler_version(real);
  if (!v) return v;
  std::error_code ec;
  fs::create_directories(fs::path(memo).parent_path(), ec);
  (void)detail::write_file_atomic(memo, *v);  // best effort: asked again next time
  return v;
}


}  // namespace neffcache::shim
