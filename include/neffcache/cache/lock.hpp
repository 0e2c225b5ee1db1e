// Entry locks: "<hlo file name>.lock", the file the Neuron cache uses, held with an OFD
// fcntl lock (the kernel drops it when the holder dies; NFSv4 carries it between
// hosts) and holding an owner record. The file's mtime is the owner's heartbeat.
//
// Judging a lock, in order:
//   1. kernel lock held by someone        -> live (never robbed)
//   2. no owner record (existence-only lock of an unmodified client)
//                                         -> live until older than anonymous_stale_after
//   3. owner on this boot of this host and its process is gone -> stale at once
//   4. otherwise (owner alive but not holding the kernel lock, or on another host
//      whose kernel locks do not reach us) -> live until its heartbeat is older than
//      stale_after
// A stale lock is taken over in place; a live one is reported busy with its owner.
//
// An LNL entry's lock is <root>/.<key>.compilation_metadata.lock held with flock(2), as
// its clients hold it: the file means nothing by itself (clients leave it behind), the
// kernel lock is all. We take it the same way, so that our compile and a client's exclude
// each other, and write the holder file beside it as a client does (LnlHolder), naming
// this process: a rank that arrives meanwhile waits for us instead of judging the lock
// dead and removing it.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>

#include <chrono>
#include <map>
#include <mutex>
#include <utility>
#include <optional>
#include <string>

#include <neffcache/core/clock.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// How long a record-holding owner may go without a heartbeat before it is presumed
// dead when its kernel lock does not reach us (another host, a file system without
// fcntl locks). Holders refresh every k_lock_stale_after / 4.
inline constexpr std::chrono::milliseconds k_lock_stale_after{20'000};

struct LockOptions {
  std::chrono::milliseconds stale_after = k_lock_stale_after;
  std::chrono::milliseconds anonymous_stale_after = k_anonymous_lock_stale_after;
  std::chrono::milliseconds poll_interval{100};  // acquire(): pause between tries
  const Clock* clock = &system_clock();
  // Who we are; tests set another host to act as a second machine. Default: this process.
  std::optional<detail::ProcessIdentity> identity;

  std::chrono::milliseconds heartbeat_interval() const { return stale_after / 4; }
};

struct LockOwner {
  detail::ProcessIdentity process;
  std::string instance;  // random per acquisition: tells two holds by one process apart
};

enum class LockState { absent, live, stale };

struct LockInfo {
  LockState state = LockState::absent;
  std::optional<LockOwner> owner;  // none for an existence-only lock
  bool kernel_locked = false;
  std::chrono::milliseconds age{0};  // since the last heartbeat (mtime)
  std::string reason;                // one line, for messages and `clear-locks`
};

namespace detail {

NEFFCACHE_DECL std::string lock_record(const LockOwner& o);

NEFFCACHE_DECL std::optional<LockOwner> parse_lock_record(std::string_view text);

NEFFCACHE_DECL std::string read_fd(int fd);

NEFFCACHE_DECL bool set_ofd_lock(int fd, short type);

NEFFCACHE_DECL bool kernel_lock_held_elsewhere(int fd);

// Decides live or stale for a lock whose kernel lock is known (see the file comment).
NEFFCACHE_DECL LockInfo judge_lock(bool kernel_locked, std::optional<LockOwner> owner,
                                   std::chrono::milliseconds age, const LockOptions& opts,
                                   const ProcessIdentity& self);

inline std::chrono::milliseconds heartbeat_age(const struct stat& st, const Clock& clock) {
  return std::max(std::chrono::milliseconds(0),
                  std::chrono::duration_cast<std::chrono::milliseconds>(clock.now() - to_time_point(st.st_mtim)));
}

inline bool same_file(const struct stat& a, const struct stat& b) {
  return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

}  // namespace detail

// Reads a lock without taking it: `name` relative to the folder `dir_fd` (AT_FDCWD
// for a plain path). A missing file is LockState::absent.
NEFFCACHE_DECL Result<LockInfo> inspect_lock_at(int dir_fd, const std::string& name, const LockOptions& opts = {});

inline Result<LockInfo> inspect_lock(const std::string& path, const LockOptions& opts = {}) {
  return inspect_lock_at(AT_FDCWD, path, opts);
}

namespace detail {

// The LNL locks (flocks) this process holds or is taking, by file. A flock carries no
// owner, so this is how a daemon tells its own compile of an entry from a client's.
class HeldFlocks {
 public:
  using Id = std::pair<dev_t, ino_t>;
  void add(Id id) {
    std::lock_guard lk(mu_);
    ++held_[id];
  }
  void remove(Id id) {
    std::lock_guard lk(mu_);
    if (auto it = held_.find(id); it != held_.end() && --it->second == 0) held_.erase(it);
  }
  bool contains(Id id) const {
    std::lock_guard lk(mu_);
    return held_.contains(id);
  }

 private:
  mutable std::mutex mu_;  // a leaf: nothing is called under it
  std::map<Id, int> held_;
};

inline HeldFlocks& held_flocks() {
  static HeldFlocks h;
  return h;
}

inline HeldFlocks::Id file_id(const struct stat& st) { return {st.st_dev, st.st_ino}; }

}  // namespace detail

namespace detail {

// Whether /proc/locks (text `locks`) lists a flock on the file `st`: lines such as
// "1: FLOCK  ADVISORY  WRITE 1234 08:01:123456 0 EOF", the device as major:minor in hex.
// Blocked requests ("1: -> FLOCK ...") are not holders. (Where st_dev is not the file
// system's own device, as in a btrfs subvolume, a holder goes unseen: the lock itself
// still excludes, only the mount's view of that entry is a moment late.)
NEFFCACHE_DECL bool proc_locks_list_flock(std::string_view locks, const struct stat& st);

}  // namespace detail

// Who holds the flock(2) of the file `name` in the folder `dir_fd`, read from /proc/locks
// without taking a lock (a probe that took one, even shared, would make a client's
// LOCK_EX|LOCK_NB fail for that instant: an LNL rank then takes itself for a waiter). A
// missing file is held by nobody; where /proc/locks cannot be read, a shared lock taken
// and dropped at once asks instead.
enum class FlockHolder { nobody, this_process, another_process };
NEFFCACHE_DECL FlockHolder flock_holder_at(int dir_fd, const std::string& name);

inline bool flock_held_at(int dir_fd, const std::string& name) {
  return flock_holder_at(dir_fd, name) != FlockHolder::nobody;
}

// The one judge of whether an entry's lock is held, as try_acquire would judge it: the lock
// `name` (EntryFiles::lock_name, or a path) in the folder `dir_fd` of an entry whose files
// are `files`. An LNL lock is held while any process holds its flock; our lock file while
// its owner lives (a file gone meanwhile is no lock). A lock that cannot be read counts as
// held: doubt never robs anyone.
NEFFCACHE_DECL bool lock_held_at(int dir_fd, const std::string& name, const EntryFiles& files,
                                 const LockOptions& opts = {});

// Whether that lock is held by a client of the cache compiling the entry itself, not by a
// neffcache compile (which a mount shows as a plain folder): an LNL flock held by another
// process (a compile of this process holds it too); our lock file while its owner lives,
// without our owner record (an unmodified libneuronxla's existence-style lock).
NEFFCACHE_DECL bool client_lock_held_at(int dir_fd, const std::string& name, const EntryFiles& files);

// The state of a walked entry, its lock judged by lock_held_at.
NEFFCACHE_DECL EntryState entry_state(const EntryRef& e, const LockOptions& opts = {});

// The lock file of an entry folder, present or not (an LNL lock beside the folder).
NEFFCACHE_DECL std::string entry_lock_path(const std::string& entry_dir, const EntryFiles& files);

// What a client's create of an entry's lock file found where other hosts share the cache
// (store::Remote::hold_for_client, S3Tier::hold_for_client).
struct ClientHold {
  enum Kind {
    here_only,  // nothing elsewhere to hold, or it could not be asked (`why` says so)
    taken,      // held for the client until it lets go of its lock
    elsewhere,  // another host holds the entry (`why`: who)
    done,       // the entry is done elsewhere: nothing to hold (the client finds it, looking again)
  } kind = here_only;
  std::string why = {};
};

// Whether the lock of the entry folder `entry_dir` (whose files are `files`) is held by
// someone (lock_held_at).
NEFFCACHE_DECL bool entry_locked(const std::string& entry_dir, const EntryFiles& files,
                                 const LockOptions& opts = {});

// A held entry lock. Move-only; released (file removed, kernel lock dropped) by
// release() or the destructor.
class [[nodiscard]] EntryLock {
 public:
  EntryLock(EntryLock&&) noexcept = default;
  EntryLock& operator=(EntryLock&& o) noexcept;
  ~EntryLock() { release(); }

  // Takes the lock now or fails with Errc::busy (message: who holds it and why that
  // counts as live). A stale lock is taken over; previous() then says from whom.
  static Result<EntryLock> try_acquire(const std::string& path, const LockOptions& opts = {});

  // Takes the flock(2) of `path` (an LNL lock, see the file comment) now or fails with
  // Errc::busy. The file is created if absent and never removed: a client may be
  // opening it to wait on it.
  static Result<EntryLock> try_acquire_flock(const std::string& path);

  // The lock of the entry folder `entry_dir` whose files are `files`, of its dialect; of
  // an LNL entry with the holder file written (its name: the lock's without ".lock").
  static Result<EntryLock> try_acquire_entry(const std::string& entry_dir, const EntryFiles& files,
                                             const LockOptions& opts = {});

  // try_acquire until it succeeds or `deadline` passes (Errc::timed_out, with the
  // holder's description). Never waits forever.
  static Result<EntryLock> acquire(const std::string& path, std::chrono::steady_clock::time_point deadline,
                                   const LockOptions& opts = {});

  // Refreshes the heartbeat. Errc::busy when the lock file is no longer ours (removed
  // or replaced by someone who judged us dead): the holder must stop, not publish.
  Result<void> heartbeat();

  // Removes the lock file (if it is still ours) and drops the kernel lock. Idempotent.
  void release();

  bool held() const { return static_cast<bool>(fd_); }
  // The open lock file. A child that inherits it holds the kernel lock as long as it
  // lives (RunSpec::inherit_fd).
  int descriptor() const { return fd_.get(); }
  const std::string& path() const { return path_; }
  // Set when the lock was taken over from a stale holder: what it was and why.
  const std::optional<LockInfo>& previous() const { return previous_; }

 private:
  struct Created {
    detail::UniqueFd fd;  // empty: the lock file already exists
  };

  EntryLock(detail::UniqueFd fd, std::string path, std::optional<LockInfo> previous)
      : fd_(std::move(fd)), path_(std::move(path)), previous_(std::move(previous)) {}

  // Creates the lock file with our record already in it and our kernel lock already
  // on it: written under a private name, locked, then link()ed into place, which fails
  // if the name exists. No process ever sees an empty or unlocked lock file of ours.
  static Result<Created> create(const std::string& path, const LockOwner& me);

  static Error busy(const std::string& path, const LockInfo& info);

  detail::UniqueFd fd_;
  std::string path_;
  std::optional<LockInfo> previous_;
  bool flock_ = false;  // an LNL lock (try_acquire_flock)
};

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/lock.ipp>
#endif
