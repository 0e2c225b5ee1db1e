// Small file helpers over the system-call seam (sys.hpp), which retries EINTR.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache::detail {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
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
inline Result<UniqueFd> open_regular(const std::string& path, struct stat* out = nullptr) {
  UniqueFd fd(sys::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW));
  if (!fd && errno == ELOOP) return Error{Errc::invalid_argument, fmt::format("{}: not a regular file but a link", path)};
  if (!fd) return sys_error("open", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return sys_error("stat", path);
  if (out) *out = st;
  if (!S_ISREG(st.st_mode)) return Error{Errc::invalid_argument, fmt::format("{}: not a regular file", path)};
  return fd;
}

// Reads a whole regular file. Missing file: Errc::not_found.
inline Result<std::string> read_file(const std::string& path) {
  struct stat st {};
  auto fd = open_regular(path, &st);
  if (!fd) return fd.error();
  std::string out;
  out.reserve(static_cast<std::size_t>(st.st_size));
  char buf[1 << 16];
  for (;;) {
    ssize_t n = sys::read(fd->get(), buf, sizeof buf);
    if (n < 0) return sys_error("read", path);
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

inline Result<void> write_all(int fd, std::string_view bytes, const std::string& what) {
  while (!bytes.empty()) {
    ssize_t n = sys::write(fd, bytes.data(), bytes.size());
    if (n < 0) return sys_error("write", what);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

// Writes `bytes` to a temporary file beside `path`, fsyncs it and renames it over
// `path`: readers see the old content or the new one, never a part. On any failure
// the temporary file is removed and `path` is untouched.
inline Result<void> write_file_atomic(const std::string& path, std::string_view bytes,
                                      mode_t mode = 0644, const std::optional<FileOwner>& owner = {}) {
  std::random_device rd;
  std::string tmp = fmt::format("{}.neffcache-tmp.{:08x}", path, rd());
  UniqueFd fd(sys::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!fd) return sys_error("create", tmp);
  give(fd.get(), owner);
  auto fail = [&](Error e) {
    sys::unlink(tmp.c_str());
    return e;
  };
  if (auto r = write_all(fd.get(), bytes, tmp); !r) return fail(r.error());
  if (sys::fsync(fd.get()) != 0) return fail(sys_error("fsync", tmp));
  fd.reset();
  if (sys::rename(tmp.c_str(), path.c_str()) != 0) return fail(sys_error("rename", path));
  return {};
}

}  // namespace neffcache::detail
