// Definitions of core/detail/fs.hpp (core/decl.hpp).
#pragma once

#include <neffcache/core/detail/fs.hpp>

#include <fcntl.h>

#include <climits>

#include <fmt/format.h>

#include <neffcache/core/detail/proc.hpp>

namespace neffcache::detail {

NEFFCACHE_DECL UniqueFd& UniqueFd::operator=(UniqueFd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}

NEFFCACHE_DECL Result<UniqueFd> open_regular(const std::string& path, struct stat* out) {
  UniqueFd fd(sys::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW));
  if (!fd && errno == ELOOP)
    return Error{Errc::invalid_argument, fmt::format("{}: not a regular file but a link", path)};
  if (!fd) return sys_error("open", path);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return sys_error("stat", path);
  if (out) *out = st;
  if (!S_ISREG(st.st_mode)) return Error{Errc::invalid_argument, fmt::format("{}: not a regular file", path)};
  return fd;
}

NEFFCACHE_DECL Result<std::string> read_file(const std::string& path) {
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

NEFFCACHE_DECL Result<void> write_all(int fd, std::string_view bytes, const std::string& what) {
  while (!bytes.empty()) {
    ssize_t n = sys::write(fd, bytes.data(), bytes.size());
    if (n < 0) return sys_error("write", what);
    bytes.remove_prefix(static_cast<std::size_t>(n));
  }
  return {};
}

NEFFCACHE_DECL std::string temp_name_beside(std::string_view path) {
  return fmt::format("{}.neffcache-tmp.{:08x}", path, static_cast<uint32_t>(random_u64()));
}

NEFFCACHE_DECL Result<void> write_file_atomic(const std::string& path, std::string_view bytes, mode_t mode,
                                              const std::optional<FileOwner>& owner, std::string tmp) {
  if (tmp.empty()) tmp = temp_name_beside(path);
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

NEFFCACHE_DECL std::string path_of_fd(int fd) {
  char buf[PATH_MAX];
  const std::string link = fmt::format("/proc/self/fd/{}", fd);
  ssize_t n = ::readlink(link.c_str(), buf, sizeof buf);
  return n > 0 && n < static_cast<ssize_t>(sizeof buf) ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

}  // namespace neffcache::detail
