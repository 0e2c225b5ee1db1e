// Definitions of cache/nki.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/nki.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL bool is_plain_relative_path(std::string_view rel) {
  if (rel.empty() || rel.front() == '/' || rel.find('\0') != std::string_view::npos) return false;
  for (std::size_t at = 0; at <= rel.size();) {
    auto end = rel.find('/', at);
    if (end == std::string_view::npos) end = rel.size();
    const auto part = rel.substr(at, end - at);
    if (part.empty() || part == "." || part == "..") return false;
    at = end + 1;
  }
  return true;
}

NEFFCACHE_DECL std::optional<std::string> kernel_relative_path(std::string_view dir, std::string_view kernel) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  if (dir.empty() || dir.front() != '/' || kernel.size() <= dir.size() + 1 || !kernel.starts_with(dir) ||
      (dir != "/" && kernel[dir.size()] != '/'))
    return std::nullopt;
  auto rel = kernel.substr(dir == "/" ? 1 : dir.size() + 1);
  if (!is_plain_relative_path(rel)) return std::nullopt;
  return std::string(rel);
}

NEFFCACHE_DECL Result<detail::UniqueFd> open_kernel_dir(const std::string& dir) {
  detail::UniqueFd fd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!fd) return sys_error("open the NKI kernel folder", dir);
  return fd;
}

namespace detail {

NEFFCACHE_DECL Result<UniqueFd> walk_beneath(int dir_fd, std::string_view rel, bool create) {
  UniqueFd at(::fcntl(dir_fd, F_DUPFD_CLOEXEC, 0));
  if (!at) return sys_error("duplicate", "the NKI kernel folder");
  for (std::size_t begin = 0;;) {
    const auto end = rel.find('/', begin);
    if (end == std::string_view::npos) return at;
    const std::string part(rel.substr(begin, end - begin));
    if (create && ::mkdirat(at.get(), part.c_str(), 0755) != 0 && errno != EEXIST)
      return sys_error("create", std::string(rel.substr(0, end)));
    UniqueFd next(::openat(at.get(), part.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!next) return sys_error("open", std::string(rel.substr(0, end)));
    at = std::move(next);
    begin = end + 1;
  }
}

}  // namespace detail

NEFFCACHE_DECL Result<detail::UniqueFd> open_kernel(int dir_fd, const std::string& rel) {
  auto parent = detail::walk_beneath(dir_fd, rel, /*create=*/false);
  if (!parent) return parent.error();
  const std::string name = rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1);
  detail::UniqueFd fd(
      ::openat(parent->get(), name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (!fd) return sys_error("open the NKI kernel", rel);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    return Error{Errc::invalid_argument, fmt::format("{}: the NKI kernel is not a regular file", rel)};
  return fd;
}

}  // namespace neffcache
