// Who this process is, in terms another process can check: host, boot, pid and the
// pid's start time (pids are reused; a pid with another start time is another process).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>

#include <fmt/format.h>

#include <neffcache/detail/fs.hpp>

namespace neffcache::detail {

struct ProcessIdentity {
  std::string host;
  std::string boot_id;  // /proc/sys/kernel/random/boot_id: changes at every boot
  int64_t pid = 0;
  uint64_t start_time = 0;  // field 22 of /proc/<pid>/stat, in clock ticks since boot
};

// Start time of `pid`, or nothing when no such process exists (or it is a zombie
// being reaped). Field 2 (comm) may hold spaces and parentheses, so fields are counted
// from the last ')'.
inline std::optional<uint64_t> process_start_time(int64_t pid) {
  auto stat = read_file(fmt::format("/proc/{}/stat", pid));
  if (!stat) return std::nullopt;
  auto close = stat->rfind(')');
  if (close == std::string::npos) return std::nullopt;
  std::size_t at = close + 2;  // field 3
  for (int field = 3; field < 22; ++field) {
    at = stat->find(' ', at);
    if (at == std::string::npos) return std::nullopt;
    ++at;
  }
  if ((*stat)[close + 2] == 'Z') return std::nullopt;  // exited, not yet reaped
  return std::strtoull(stat->c_str() + at, nullptr, 10);
}

// This process. Host and boot id are read once; pid and start time every call, so a
// forked child never presents its parent's identity.
inline ProcessIdentity current_process() {
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

inline std::string random_hex64() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

}  // namespace neffcache::detail
