// The library's system-call seam. The calls that read or change a cache go through
// here: each retries EINTR, and below that retry a test may install a fault hook that
// fails chosen calls with an errno of its choice (EINTR included, to prove the retry).
// Without a hook, the cost is one atomic load per call.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string_view>

namespace neffcache::sys {

enum class Call { open, read, write, pwrite, fsync, rename, link, unlink, mkdir, mkdtemp, ftruncate };

// Returns the errno to fail the call with, or 0 to make it. `path` is empty for calls
// on a descriptor. Called from any thread that uses the library.
using FaultHook = std::function<int(Call call, std::string_view path)>;

namespace detail {
inline std::atomic<const FaultHook*> fault_hook{nullptr};

// Runs the hook: true when it failed the call (errno is set).
inline bool injected(Call call, std::string_view path) {
  const FaultHook* hook = fault_hook.load(std::memory_order_acquire);
  if (!hook) return false;
  int err = (*hook)(call, path);
  if (err == 0) return false;
  errno = err;
  return true;
}

template <class F>
auto call(Call c, std::string_view path, F f) {
  decltype(f()) r;
  do r = injected(c, path) ? -1 : f();
  while (r == -1 && errno == EINTR);
  return r;
}
}  // namespace detail

// Installs `hook` for this object's lifetime; one at a time, for tests.
class ScopedFaultHook {
 public:
  explicit ScopedFaultHook(FaultHook hook) : hook_(std::move(hook)) { detail::fault_hook.store(&hook_); }
  ~ScopedFaultHook() { detail::fault_hook.store(nullptr); }
  ScopedFaultHook(const ScopedFaultHook&) = delete;
  ScopedFaultHook& operator=(const ScopedFaultHook&) = delete;

 private:
  FaultHook hook_;
};

inline int open(const char* path, int flags, mode_t mode = 0) {
  return detail::call(Call::open, path, [&] { return ::open(path, flags, mode); });
}
inline int openat(int dir_fd, const char* path, int flags, mode_t mode = 0) {
  return detail::call(Call::open, path, [&] { return ::openat(dir_fd, path, flags, mode); });
}
inline ssize_t read(int fd, void* buf, size_t n) {
  return detail::call(Call::read, {}, [&] { return ::read(fd, buf, n); });
}
inline ssize_t pread(int fd, void* buf, size_t n, off_t at) {
  return detail::call(Call::read, {}, [&] { return ::pread(fd, buf, n, at); });
}
inline ssize_t write(int fd, const void* buf, size_t n) {
  return detail::call(Call::write, {}, [&] { return ::write(fd, buf, n); });
}
inline ssize_t pwrite(int fd, const void* buf, size_t n, off_t at) {
  return detail::call(Call::pwrite, {}, [&] { return ::pwrite(fd, buf, n, at); });
}
inline int fsync(int fd) {
  return detail::call(Call::fsync, {}, [&] { return ::fsync(fd); });
}
inline int syncfs(int fd) {  // (a fault hook sees it as an fsync)
  return detail::call(Call::fsync, {}, [&] { return ::syncfs(fd); });
}
inline int ftruncate(int fd, off_t size) {
  return detail::call(Call::ftruncate, {}, [&] { return ::ftruncate(fd, size); });
}
inline int rename(const char* from, const char* to) {
  return detail::call(Call::rename, to, [&] { return ::rename(from, to); });
}
inline int link(const char* from, const char* to) {
  return detail::call(Call::link, to, [&] { return ::link(from, to); });
}
inline int linkat(int from_dir, const char* from, int to_dir, const char* to, int flags) {
  return detail::call(Call::link, to, [&] { return ::linkat(from_dir, from, to_dir, to, flags); });
}
inline int unlink(const char* path) {
  return detail::call(Call::unlink, path, [&] { return ::unlink(path); });
}
inline int mkdir(const char* path, mode_t mode) {
  return detail::call(Call::mkdir, path, [&] { return ::mkdir(path, mode); });
}
// mkdtemp(3) returns a pointer: nullptr on failure, like the others' -1.
inline char* mkdtemp(char* tmpl) {
  int r = detail::call(Call::mkdtemp, tmpl, [&] { return ::mkdtemp(tmpl) ? 0 : -1; });
  return r == 0 ? tmpl : nullptr;
}

}  // namespace neffcache::sys
