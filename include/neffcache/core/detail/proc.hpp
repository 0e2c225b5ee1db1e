// Who this process is, in terms another process can check: host, boot, pid and the
// pid's start time (pids are reused; a pid with another start time is another process).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <neffcache/core/detail/fs.hpp>

namespace neffcache::detail {

struct ProcessIdentity {
  std::string host;
  std::string boot_id;  // /proc/sys/kernel/random/boot_id: changes at every boot
  int64_t pid = 0;
  uint64_t start_time = 0;  // field 22 of /proc/<pid>/stat, in clock ticks since boot
};

// The fields of /proc/<pid>/stat from field 3 (the state) on: fields[0] is field 3.
// Nothing when no such process exists. Field 2 (comm) may hold spaces and parentheses,
// so fields are counted from the last ')'.
inline std::optional<std::vector<std::string>> proc_stat_fields(int64_t pid) {
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

// Start time of `pid`, or nothing when no such process exists (or it is a zombie
// being reaped).
inline std::optional<uint64_t> process_start_time(int64_t pid) {
  auto fields = proc_stat_fields(pid);
  if (!fields || fields->size() < 22 - 2 || (*fields)[0] == "Z") return std::nullopt;  // Z: exited, not reaped
  return std::strtoull((*fields)[22 - 3].c_str(), nullptr, 10);
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
