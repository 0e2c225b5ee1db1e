// FUSE passthrough (libfuse 3.16, Linux 6.9): the kernel reads an open file from its backing
// file itself, without a READ request to the daemon and without a copy through it.
//
// Which opens pass through: readers of a finished file (a done entry's NEFF, in either
// dialect; namespace.cpp), and every open of a file while readers pass through it.
// Everything else goes through the daemon as before: placeholders and the opens waiting
// for a compile (direct I/O), stats.json, lock files, writes, plain files.
//
// The kernel's rule per inode: while one open of it passes through, every other open must
// pass through too, with the same backing file (else that open fails with EIO); and an
// inode opened with the page cache (not direct I/O, not passthrough) cannot take a
// passthrough open until those opens end. So each inode counts its opens of each kind:
//   - a reader of a finished file passes through, unless the inode has cached opens (then
//     it is served through the daemon, and counted as `busy`);
//   - any open of an inode with passthrough opens passes through with its backing file,
//     a writer (or O_TRUNC) too: the kernel opens the writer's own backing file from it
//     with the writer's flags, so readers see its writes as on a disk (the daemon, told
//     at the open, drops what it and the kernel kept of the old bytes). Only a file of a
//     read-only lower layer, which the copy up replaces, refuses it with ETXTBSY;
//   - registering the backing file can fail (a file on a stacked file system deeper than
//     the kernel allows, a kernel that lost the capability): the open is served through
//     the daemon and counted as a fallback.
// The backing file is registered at the first passthrough open and given back at the last
// release. Needs root (CAP_SYS_ADMIN), a kernel that offers it and a libfuse that has it;
// otherwise, or with --no-passthrough, the mount works as before and says once why.
#pragma once

#define FUSE_USE_VERSION 312
#include <fcntl.h>
#include <fuse_lowlevel.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "caller.hpp"
#include "inode_table.hpp"

namespace neffcachefs {

#ifdef FUSE_CAP_PASSTHROUGH
inline constexpr bool k_libfuse_has_passthrough = true;
// The backing file an open's answer names: the kernel reads it itself (0: none). What the
// kernel may keep of such an open: cache_policy.hpp.
inline int backing_of(const fuse_file_info& fi) { return fi.backing_id; }
inline void set_backing(fuse_file_info& fi, int id) { fi.backing_id = id; }
#else
inline constexpr bool k_libfuse_has_passthrough = false;
inline int backing_of(const fuse_file_info&) { return 0; }
inline void set_backing(fuse_file_info&, int) {}
#endif

// An open that may change the file: it writes, or truncates it.
inline bool opens_to_write(int flags) { return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC); }

class Passthrough {
 public:
  std::atomic<uint64_t> opens{0};      // opens the kernel reads (and writes) without the daemon
  std::atomic<uint64_t> writers{0};    // of those, opens that write
  std::atomic<uint64_t> fallbacks{0};  // backing file not registered: served by the daemon
  std::atomic<uint64_t> busy{0};       // readers served by the daemon: the inode had cached opens

  // At the session's start: asks the kernel for passthrough when `wanted` and everything
  // needed is there. Returns why it is off ("" when on).
  std::string negotiate(fuse_conn_info* conn, bool wanted);
  bool on() const { return on_ && !refused_; }
  std::string why_off() const;
  // stats.json's "passthrough" section: on, why_off (null when on), and the counters.
  nlohmann::ordered_json stats() const;

  // Before an open that writes (or truncates) `i` touches its file: while readers pass
  // through, it does too (its backing file named in `fi`), or ETXTBSY when their backing
  // file is a read-only lower layer's; else it is counted as a cached open from here on.
  // not_answered() takes it back if the open then fails.
  int writer_opening(Inode& i, fuse_file_info& fi);
  // A reader of `i` about to be answered with the descriptor fi.fh. `eligible`: a reader of
  // a finished file; `lower`: the file is a read-only lower layer's. Names the backing file
  // in `fi` when it passes through (backing_of).
  void reader_opening(const Caller& caller, Inode& i, fuse_file_info& fi, bool eligible, bool lower);
  // The release of an open that either call counted (placeholders: none, and none counted).
  void ended(const Caller& caller, Inode& i);
  // An open counted but never answered, or whose answer did not reach the kernel (no
  // release will come). Its request is gone, so a backing file it leaves unused is given
  // back at the next call that has one.
  void not_answered(Inode& i);

 private:
  // negotiate's decision, on_ and why_off_ set.
  std::string decide(fuse_conn_info* conn, bool wanted);

  bool on_ = false;  // negotiated (set once, before any request)
  std::string why_off_ = "not negotiated";
  // Set once on_ and why_off_ are: a thread that is no request's (the metrics file) reads
  // them only after it.
  std::atomic<bool> negotiated_{false};
  // The kernel refused a registration with EPERM (root in a user namespace is not
  // CAP_SYS_ADMIN where it counts): no further tries, served by the daemon.
  std::atomic<bool> refused_{false};
  // Rank 90 (docs/ARCHITECTURE.md), a leaf: guards each Inode's passthrough counts. Never
  // held across an ioctl: a registration marks its inode (Inode::backing_registering), and
  // the other opens of that inode wait on registered_ until it ends.
  std::mutex mu_;
  std::condition_variable registered_;
  std::vector<int> to_close_;  // guarded by mu_: see not_answered
  // With mu_ held: one fewer open of `i`; its backing file's id when that was the last.
  int end_locked(Inode& i);
  // Gives back the backing files of opens whose answer never reached the kernel.
  void close_pending(const Caller& caller);
};

}  // namespace neffcachefs
