// Who this process is, in terms another process can check: host, boot, pid and the
// pid's start time (pids are reused; a pid with another start time is another process).
// And what a process group holds in memory now (group_rss_kib).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/core/decl.hpp>
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
NEFFCACHE_DECL std::optional<std::vector<std::string>> proc_stat_fields(int64_t pid);

// Start time of `pid`, or nothing when no such process exists (or it is a zombie
// being reaped).
NEFFCACHE_DECL std::optional<uint64_t> process_start_time(int64_t pid);

// A process's name (/proc/<pid>/comm, without its newline) and its argv (/proc/<pid>/cmdline).
struct ProcessCommand {
  std::string comm;
  std::vector<std::string> argv;
};
// Of `pid` ("self" for this process); nothing when it is gone.
NEFFCACHE_DECL std::optional<ProcessCommand> process_command(std::string_view pid);

// This process. Host and boot id are read once; pid and start time every call, so a
// forked child never presents its parent's identity.
NEFFCACHE_DECL ProcessIdentity current_process();

// The resident memory (KiB) of the process whose /proc/<pid>/stat text is `stat`, when
// it is in process group `pgrp`; 0 otherwise or when the text does not parse. Field 5 is
// the group, field 24 the resident pages; both are counted from the last ')', since
// field 2 (comm) may hold spaces and parentheses.
NEFFCACHE_DECL uint64_t stat_rss_kib_in_group(std::string_view stat, pid_t pgrp, uint64_t page_kib);

// The summed resident memory, in KiB, of every process now in process group `pgrp`: one
// scan of /proc/[0-9]*/stat. A process that ends during the scan is skipped; a zombie
// holds none. Pages that processes share (a fork's copy-on-write pages, libraries) count
// once per process, so the sum may overstate, never understate, what the group holds
// (as a memory reservation wants it). A process that left the group (setsid, setpgid) is
// not counted. Never fails: an unreadable /proc gives 0.
// Raw system calls, not the sys seam: it runs at moments that depend on timing, and tests
// that inject faults count a compile's seam calls in order.
NEFFCACHE_DECL uint64_t group_rss_kib(pid_t pgrp);

// 64 random bits from the kernel (getrandom(2)), for names and identities that must not
// collide between processes and hosts; the one source of randomness of the library.
// (std::random_device would bind the programs to arc4random, glibc 2.36: cmake/dependencies.cmake.)
NEFFCACHE_DECL uint64_t random_u64();
// random_u64() as 16 hexadecimal digits.
NEFFCACHE_DECL std::string random_hex64();

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/core/detail/proc.ipp>
#endif
