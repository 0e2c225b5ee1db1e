// Definitions of core/detail/proc.hpp (core/decl.hpp).
#pragma once

#include <neffcache/core/detail/proc.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <sys/random.h>

#include <algorithm>
#include <charconv>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include <fmt/format.h>

namespace neffcache::detail {

NEFFCACHE_DECL std::optional<std::vector<std::string>> proc_stat_fields(int64_t pid) {
  auto stat = read_file(fmt::format("/proc/{}/stat", pid));
  if (!stat) return std::nullopt;
  auto close = stat->rfind(')');
  if (close == std::string::npos || close + 2 > stat->size()) return std::nullopt;
  std::vector<std::string> fields;
  std::string_view rest = std::string_view(*stat).substr(close + 2);
  for (std::size_t at = 0; at < rest.size();) {
    auto end = std::min(rest.find_first_of(" \n", at), rest.size());
    fields.emplace_back(rest.substr(at, end - at));
    at = end + 1;
  }
  return fields;
}

NEFFCACHE_DECL std::optional<uint64_t> process_start_time(int64_t pid) {
  auto fields = proc_stat_fields(pid);
  if (!fields || fields->size() < 22 - 2 || (*fields)[0] == "Z") return std::nullopt;  // Z: exited, not reaped
  return std::strtoull((*fields)[22 - 3].c_str(), nullptr, 10);
}

NEFFCACHE_DECL std::optional<ProcessCommand> process_command(std::string_view pid) {
  auto comm = read_file(fmt::format("/proc/{}/comm", pid));
  auto cmdline = read_file(fmt::format("/proc/{}/cmdline", pid));
  if (!comm || !cmdline) return std::nullopt;
  ProcessCommand c;
  c.comm = std::move(*comm);
  while (!c.comm.empty() && c.comm.back() == '\n') c.comm.pop_back();
  for (std::size_t at = 0; at < cmdline->size();) {
    auto end = std::min(cmdline->find('\0', at), cmdline->size());
    c.argv.push_back(cmdline->substr(at, end - at));
    at = end + 1;
  }
  return c;
}

NEFFCACHE_DECL ProcessIdentity current_process() {
  static const ProcessIdentity machine = [] {
    ProcessIdentity p;
    char host[256] = {};
    ::gethostname(host, sizeof host - 1);
    p.host = host;
    if (auto b = read_file("/proc/sys/kernel/random/boot_id")) {
      p.boot_id = *b;
      while (!p.boot_id.empty() && p.boot_id.back() == '\n') p.boot_id.pop_back();
    }
    return p;
  }();
  ProcessIdentity p = machine;
  p.pid = ::getpid();
  p.start_time = process_start_time(p.pid).value_or(0);
  return p;
}

NEFFCACHE_DECL uint64_t stat_rss_kib_in_group(std::string_view stat, pid_t pgrp, uint64_t page_kib) {
  auto close = stat.rfind(')');
  if (close == std::string_view::npos) return 0;
  std::string_view rest = stat.substr(close + 1);
  int field = 2;  // the one that ended at ')'
  for (std::size_t at = 0; at < rest.size();) {
    at = rest.find_first_not_of(" \n", at);
    if (at == std::string_view::npos) break;
    auto end = std::min(rest.find_first_of(" \n", at), rest.size());
    ++field;
    if (field == 5 || field == 24) {
      long long value = -1;
      auto [p, ec] = std::from_chars(rest.data() + at, rest.data() + end, value);
      if (ec != std::errc() || p != rest.data() + end) return 0;
      if (field == 5 && value != pgrp) return 0;
      if (field == 24) return value > 0 ? static_cast<uint64_t>(value) * page_kib : 0;
    }
    at = end;
  }
  return 0;
}

NEFFCACHE_DECL uint64_t group_rss_kib(pid_t pgrp) {
  static const uint64_t page_kib = [] {
    long page = ::sysconf(_SC_PAGESIZE);
    return static_cast<uint64_t>(page > 0 ? page : 4096) / 1024;
  }();
  DIR* proc = ::opendir("/proc");
  if (!proc) return 0;
  uint64_t total = 0;
  char path[sizeof "/proc//stat" + sizeof(dirent::d_name)];
  char buf[1024];  // comm is at most 64 bytes; the fields before rss fit many times over
  while (const dirent* d = ::readdir(proc)) {
    if (d->d_name[0] < '1' || d->d_name[0] > '9' || std::strspn(d->d_name, "0123456789") != std::strlen(d->d_name))
      continue;
    std::snprintf(path, sizeof path, "/proc/%s/stat", d->d_name);
    int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;  // ended meanwhile
    ssize_t n;
    do n = ::read(fd, buf, sizeof buf);
    while (n < 0 && errno == EINTR);
    ::close(fd);
    if (n > 0) total += stat_rss_kib_in_group(std::string_view(buf, static_cast<std::size_t>(n)), pgrp, page_kib);
  }
  ::closedir(proc);
  return total;
}

NEFFCACHE_DECL uint64_t random_u64() {
  uint64_t value = 0;
  for (;;) {
    // (Up to 256 bytes come whole once the kernel's pool was filled at boot; only a signal
    // interrupts the wait before.)
    ssize_t n = ::getrandom(&value, sizeof value, 0);
    if (n == static_cast<ssize_t>(sizeof value)) return value;
    if (n < 0 && errno == EINTR) continue;
    throw std::system_error(n < 0 ? errno : EIO, std::generic_category(), "getrandom");
  }
}

NEFFCACHE_DECL std::string random_hex64() { return fmt::format("{:016x}", random_u64()); }

}  // namespace neffcache::detail
