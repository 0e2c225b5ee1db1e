// Small file helpers over the system-call seam (sys.hpp), which retries EINTR.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache::detail {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept;
  UniqueFd(const UniqueFd&) = delete;
  UniqueFd& operator=(const UniqueFd&) = delete;
  ~UniqueFd() { reset(); }

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset() {
    // close() is not retried on EINTR: on Linux the fd is released either way.
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

// A file time as a system_clock time point.
inline std::chrono::system_clock::time_point to_time_point(const struct timespec& ts) {
  return std::chrono::system_clock::time_point(std::chrono::duration_cast<std::chrono::system_clock::duration>(
      std::chrono::seconds(ts.tv_sec) + std::chrono::nanoseconds(ts.tv_nsec)));
}

inline std::string getenv_or(const char* name, std::string fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

template <class F>
auto retry_eintr(F f) {
  decltype(f()) r;
  do r = f();
  while (r == -1 && errno == EINTR);
  return r;
}

// Who a file we create should belong to, when not to us.
struct FileOwner {
  uid_t uid;
  gid_t gid;
};

// Gives the file to `to`. Only root may, and only root is asked to (see entry_owner). A
// file system that refuses (NFS with root squash) leaves it ours: no less safe.
inline void give(int fd, const std::optional<FileOwner>& to) {
  if (to) (void)!::fchown(fd, to->uid, to->gid);
}

// Opens a regular file for reading. Anything else is Errc::invalid_argument and is not
// read: a FIFO would block the open or the read forever, a device never end, and a
// link may lead anywhere (a root daemon must not copy /etc/shadow into a cache).
NEFFCACHE_DECL Result<UniqueFd> open_regular(const std::string& path, struct stat* out = nullptr);

// Reads a whole regular file. Missing file: Errc::not_found.
NEFFCACHE_DECL Result<std::string> read_file(const std::string& path);

NEFFCACHE_DECL Result<void> write_all(int fd, std::string_view bytes, const std::string& what);

// The path of the file an open descriptor (O_PATH will do) names, from /proc/self/fd;
// empty if it cannot be read.
NEFFCACHE_DECL std::string path_of_fd(int fd);

// A new name beside `path` for its next content while it is written ("<path>.neffcache-tmp.<hex>",
// which cache maintenance knows), to be renamed over `path` when whole.
NEFFCACHE_DECL std::string temp_name_beside(std::string_view path);

// Writes `bytes` to a temporary file, fsyncs it and renames it over `path`: readers see
// the old content or the new one, never a part. The temporary is `tmp` (on the file
// system of `path`: a folder whose names are not ours to add to keeps it elsewhere), by
// default a new name beside `path`. On any failure the temporary file is removed and
// `path` is untouched.
NEFFCACHE_DECL Result<void> write_file_atomic(const std::string& path, std::string_view bytes, mode_t mode = 0644,
                                              const std::optional<FileOwner>& owner = {}, std::string tmp = {});

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/core/detail/fs.ipp>
#endif
