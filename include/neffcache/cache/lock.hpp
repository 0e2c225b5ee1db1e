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
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <mutex>
#include <utility>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/clock.hpp>
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

inline std::string lock_record(const LockOwner& o) {
  nlohmann::ordered_json j{{"neffcache_lock", 1},     {"host", o.process.host},
                           {"boot_id", o.process.boot_id}, {"pid", o.process.pid},
                           {"start_time", o.process.start_time}, {"instance", o.instance}};
  return j.dump() + "\n";
}

inline std::optional<LockOwner> parse_lock_record(std::string_view text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("neffcache_lock")) return std::nullopt;
  try {
    LockOwner o;
    o.process.host = j.at("host").get<std::string>();
    o.process.boot_id = j.at("boot_id").get<std::string>();
    o.process.pid = j.at("pid").get<int64_t>();
    o.process.start_time = j.at("start_time").get<uint64_t>();
    o.instance = j.at("instance").get<std::string>();
    return o;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

inline std::string read_fd(int fd) {
  std::string out;
  char buf[4096];
  for (off_t off = 0;;) {
    ssize_t n = sys::pread(fd, buf, sizeof buf, off);
    if (n <= 0 || out.size() > (1 << 16)) break;
    out.append(buf, static_cast<std::size_t>(n));
    off += n;
  }
  return out;
}

inline bool set_ofd_lock(int fd, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  return retry_eintr([&] { return ::fcntl(fd, F_OFD_SETLK, &fl); }) == 0;
}

inline bool kernel_lock_held_elsewhere(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return false;
  return fl.l_type != F_UNLCK;
}

// Decides live or stale for a lock whose kernel lock is known (see the file comment).
inline LockInfo judge_lock(bool kernel_locked, std::optional<LockOwner> owner,
                           std::chrono::milliseconds age, const LockOptions& opts,
                           const ProcessIdentity& self) {
  LockInfo info{LockState::live, std::move(owner), kernel_locked, age, {}};
  auto secs = [](std::chrono::milliseconds d) { return d.count() / 1000.0; };
  if (kernel_locked) {
    info.reason = "held by a running process";
  } else if (!info.owner) {
    bool stale = age >= opts.anonymous_stale_after;
    info.state = stale ? LockState::stale : LockState::live;
    info.reason = fmt::format("lock file without owner record, {:.0f} s old (stale after {:.0f} s)",
                              secs(age), secs(opts.anonymous_stale_after));
  } else {
    const auto& p = info.owner->process;
    bool same_boot = p.host == self.host && p.boot_id == self.boot_id;
    if (same_boot && process_start_time(p.pid) != std::optional<uint64_t>(p.start_time)) {
      info.state = LockState::stale;
      info.reason = fmt::format("owner process {} on {} is gone", p.pid, p.host);
    } else {
      bool stale = age >= opts.stale_after;
      info.state = stale ? LockState::stale : LockState::live;
      info.reason = fmt::format("owner process {} on {}, last heartbeat {:.1f} s ago (stale after {:.1f} s)",
                                p.pid, p.host, secs(age), secs(opts.stale_after));
    }
  }
  return info;
}

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
inline Result<LockInfo> inspect_lock_at(int dir_fd, const std::string& name, const LockOptions& opts = {}) {
  detail::UniqueFd fd(sys::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    if (errno == ENOENT) return LockInfo{};
    return sys_error("open lock", name);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) return sys_error("stat lock", name);
  return detail::judge_lock(detail::kernel_lock_held_elsewhere(fd.get()),
                            detail::parse_lock_record(detail::read_fd(fd.get())),
                            detail::heartbeat_age(st, *opts.clock),
                            opts, opts.identity ? *opts.identity : detail::current_process());
}

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
inline bool proc_locks_list_flock(std::string_view locks, const struct stat& st) {
  const std::string file = fmt::format("{:02x}:{:02x}:{}", major(st.st_dev), minor(st.st_dev), st.st_ino);
  for (std::size_t at = 0; at < locks.size();) {
    auto end = std::min(locks.find('\n', at), locks.size());
    std::string_view line = locks.substr(at, end - at);
    at = end + 1;
    std::vector<std::string_view> words;
    for (std::size_t w = 0; w < line.size();) {
      auto next = std::min(line.find(' ', w), line.size());
      if (next > w) words.push_back(line.substr(w, next - w));
      w = next + 1;
    }
    if (words.size() >= 6 && words[1] == "FLOCK" && words[5] == file) return true;
  }
  return false;
}

}  // namespace detail

// Who holds the flock(2) of the file `name` in the folder `dir_fd`, read from /proc/locks
// without taking a lock (a probe that took one, even shared, would make a client's
// LOCK_EX|LOCK_NB fail for that instant: an LNL rank then takes itself for a waiter). A
// missing file is held by nobody; where /proc/locks cannot be read, a shared lock taken
// and dropped at once asks instead.
enum class FlockHolder { nobody, this_process, another_process };
inline FlockHolder flock_holder_at(int dir_fd, const std::string& name) {
  detail::UniqueFd fd(sys::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0) return FlockHolder::nobody;
  if (detail::held_flocks().contains(detail::file_id(st))) return FlockHolder::this_process;
  if (auto locks = detail::read_file("/proc/locks"))
    return detail::proc_locks_list_flock(*locks, st) ? FlockHolder::another_process : FlockHolder::nobody;
  if (detail::retry_eintr([&] { return ::flock(fd.get(), LOCK_SH | LOCK_NB); }) != 0)
    return errno == EWOULDBLOCK ? FlockHolder::another_process : FlockHolder::nobody;
  ::flock(fd.get(), LOCK_UN);
  return FlockHolder::nobody;
}

inline bool flock_held_at(int dir_fd, const std::string& name) {
  return flock_holder_at(dir_fd, name) != FlockHolder::nobody;
}

// The state of a walked entry, its lock judged as try_acquire would judge it. A lock
// that cannot be read counts as live: doubt never robs anyone.
inline EntryState entry_state(const EntryRef& e, const LockOptions& opts = {}) {
  return classify(e.files, [&] {
    if (e.files.is_lnl()) return flock_held_at(e.dir_fd, e.files.lock_name());
    auto info = inspect_lock_at(e.dir_fd, e.files.lock_name(), opts);
    return !info || info->state != LockState::stale;
  });
}

// The lock file of an entry folder, present or not (an LNL lock beside the folder).
inline std::string entry_lock_path(const std::string& entry_dir, const EntryFiles& files) {
  if (!files.is_lnl()) return entry_dir + "/" + files.lock_name();
  auto dir = std::filesystem::path(entry_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // a trailing '/'
  return (dir.parent_path() / lnl_lock_name(files.key)).string();
}

// Whether the lock of the entry folder `entry_dir` (whose files are `files`) is held by
// someone, judged as try_acquire would judge it. A lock that cannot be read counts as
// held: doubt never robs anyone.
inline bool entry_locked(const std::string& entry_dir, const EntryFiles& files, const LockOptions& opts = {}) {
  const std::string path = entry_lock_path(entry_dir, files);
  if (files.is_lnl()) return flock_held_at(AT_FDCWD, path);
  auto info = inspect_lock(path, opts);
  return !info || info->state == LockState::live;
}

// A held entry lock. Move-only; released (file removed, kernel lock dropped) by
// release() or the destructor.
class [[nodiscard]] EntryLock {
 public:
  EntryLock(EntryLock&&) noexcept = default;
  EntryLock& operator=(EntryLock&& o) noexcept {
    if (this != &o) {
      release();
      fd_ = std::move(o.fd_);
      path_ = std::move(o.path_);
      previous_ = std::move(o.previous_);
      flock_ = o.flock_;
    }
    return *this;
  }
  ~EntryLock() { release(); }

  // Takes the lock now or fails with Errc::busy (message: who holds it and why that
  // counts as live). A stale lock is taken over; previous() then says from whom.
  static Result<EntryLock> try_acquire(const std::string& path, const LockOptions& opts = {}) {
    const detail::ProcessIdentity self = opts.identity ? *opts.identity : detail::current_process();
    const LockOwner me{self, detail::random_hex64()};
    // Bounded: each round either decides or saw the file change under it.
    for (int round = 0; round < 16; ++round) {
      if (auto created = create(path, me); !created) return created.error();
      else if (created->fd) return EntryLock(std::move(created->fd), path, std::nullopt);

      detail::UniqueFd fd(sys::open(path.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW));
      if (!fd) {
        if (errno == ENOENT) continue;  // released meanwhile: try to create again
        return sys_error("open lock", path);
      }
      if (!detail::set_ofd_lock(fd.get(), F_WRLCK)) {
        if (errno != EAGAIN && errno != EACCES) return sys_error("lock", path);
        return busy(path, detail::judge_lock(true, detail::parse_lock_record(detail::read_fd(fd.get())),
                                             {}, opts, self));
      }
      // We hold the kernel lock of this inode; is it still the lock file's?
      struct stat held {}, named {};
      if (::fstat(fd.get(), &held) != 0) return sys_error("stat lock", path);
      if (::lstat(path.c_str(), &named) != 0 || !detail::same_file(held, named)) continue;
      auto info = detail::judge_lock(false, detail::parse_lock_record(detail::read_fd(fd.get())),
                                     detail::heartbeat_age(held, *opts.clock), opts, self);
      if (info.state == LockState::live) return busy(path, info);
      // Stale: take it over in place, keeping the file (and so its name) present.
      std::string record = detail::lock_record(me);
      if (sys::ftruncate(fd.get(), 0) != 0 ||
          sys::pwrite(fd.get(), record.data(), record.size(), 0) !=
              static_cast<ssize_t>(record.size()) ||
          ::futimens(fd.get(), nullptr) != 0)
        return sys_error("take over lock", path);
      return EntryLock(std::move(fd), path, std::move(info));
    }
    return Error{Errc::busy, fmt::format("lock {} keeps changing under us", path)};
  }

  // Takes the flock(2) of `path` (an LNL lock, see the file comment) now or fails with
  // Errc::busy. The file is created if absent and never removed: a client may be
  // opening it to wait on it.
  static Result<EntryLock> try_acquire_flock(const std::string& path) {
    for (int round = 0; round < 16; ++round) {
      detail::UniqueFd fd(sys::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
      struct stat held {}, named {};
      if (!fd || ::fstat(fd.get(), &held) != 0) return sys_error("open lock", path);
      // Known as ours before it is taken, so that no one of this process ever sees it
      // held by "another process" (see flock_holder_at).
      auto id = detail::file_id(held);
      detail::held_flocks().add(id);
      if (detail::retry_eintr([&] { return ::flock(fd.get(), LOCK_EX | LOCK_NB); }) != 0) {
        int err = errno;
        detail::held_flocks().remove(id);
        if (err == EWOULDBLOCK) return Error{Errc::busy, fmt::format("{} is locked by another process", path)};
        return sys_error("lock", path, err);
      }
      // Ours only if the name still leads to the file we locked.
      if (::lstat(path.c_str(), &named) != 0 || !detail::same_file(held, named)) {
        detail::held_flocks().remove(id);
        continue;
      }
      EntryLock lock(std::move(fd), path, std::nullopt);
      lock.flock_ = true;
      return lock;
    }
    return Error{Errc::busy, fmt::format("lock {} keeps changing under us", path)};
  }

  // The lock of the entry folder `entry_dir` whose files are `files`, of its dialect; of
  // an LNL entry with the holder file written (its name: the lock's without ".lock").
  static Result<EntryLock> try_acquire_entry(const std::string& entry_dir, const EntryFiles& files,
                                             const LockOptions& opts = {}) {
    const std::string path = entry_lock_path(entry_dir, files);
    if (!files.is_lnl()) return try_acquire(path, opts);
    auto lock = try_acquire_flock(path);
    if (!lock) return lock;
    // A root daemon's files in a user's cache go to the owner of the root, as a rank of
    // that user made them: the rank opens the lock file O_RDWR|O_TRUNC and rewrites the
    // holder file, and must not find them root's.
    std::optional<detail::FileOwner> owner;
    struct stat root {};
    const std::string dir = std::filesystem::path(path).parent_path().string();
    if (::geteuid() == 0 && ::stat(dir.c_str(), &root) == 0) owner = detail::FileOwner{root.st_uid, root.st_gid};
    detail::give(lock->descriptor(), owner);
    const std::string holder = path.substr(0, path.size() - k_lock_suffix.size());
    if (auto w = detail::write_file_atomic(holder, lnl_holder_record(), 0644, owner); !w)
      return w.error();  // (the lock is released)
    return lock;
  }

  // try_acquire until it succeeds or `deadline` passes (Errc::timed_out, with the
  // holder's description). Never waits forever.
  static Result<EntryLock> acquire(const std::string& path, std::chrono::steady_clock::time_point deadline,
                                   const LockOptions& opts = {}) {
    for (;;) {
      auto r = try_acquire(path, opts);
      if (r || r.error().code != Errc::busy) return r;
      auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        return Error{Errc::timed_out, fmt::format("gave up waiting: {}", r.error().message)};
      std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(opts.poll_interval, deadline - now));
    }
  }

  // Refreshes the heartbeat. Errc::busy when the lock file is no longer ours (removed
  // or replaced by someone who judged us dead): the holder must stop, not publish.
  Result<void> heartbeat() {
    struct stat held {}, named {};
    if (!fd_ || ::fstat(fd_.get(), &held) != 0 || ::lstat(path_.c_str(), &named) != 0 ||
        !detail::same_file(held, named))
      return Error{Errc::busy, fmt::format("lock {} was lost", path_)};
    // A flock needs no heartbeat (the kernel drops it with its holder), only the check
    // above: an LNL rank that judged us dead removes the file and locks a new one.
    if (flock_) return {};
    if (::futimens(fd_.get(), nullptr) != 0) return sys_error("heartbeat", path_);
    return {};
  }

  // Removes the lock file (if it is still ours) and drops the kernel lock. Idempotent.
  void release() {
    if (!fd_) return;
    if (flock_) {  // the file stays (see try_acquire_flock)
      struct stat st {};
      bool known = ::fstat(fd_.get(), &st) == 0;
      fd_.reset();
      if (known) detail::held_flocks().remove(detail::file_id(st));
      return;
    }
    struct stat held {}, named {};
    if (::fstat(fd_.get(), &held) == 0 && ::lstat(path_.c_str(), &named) == 0 && detail::same_file(held, named) &&
        sys::unlink(path_.c_str()) != 0) {
      // Left in place (EIO, say): dated back to 1970, it is stale to every judge once the
      // kernel lock goes below, instead of live for stale_after while we live.
      const struct timespec epoch[2] = {{0, 0}, {0, 0}};
      ::futimens(fd_.get(), epoch);
    }
    fd_.reset();
  }

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
  static Result<Created> create(const std::string& path, const LockOwner& me) {
    auto slash = path.rfind('/');
    std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
    std::string tmp = fmt::format("{}/{}-lock-{}", dir, k_private_prefix, me.instance);
    detail::UniqueFd fd(sys::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
    if (!fd) return sys_error("create lock", tmp);
    std::string record = detail::lock_record(me);
    bool ok = detail::set_ofd_lock(fd.get(), F_WRLCK) && detail::write_all(fd.get(), record, tmp);
    int err = errno;
    bool linked = ok && sys::link(tmp.c_str(), path.c_str()) == 0;
    if (ok && !linked) err = errno;
    sys::unlink(tmp.c_str());
    if (!ok) return sys_error("create lock", tmp, err);
    if (!linked) {
      if (err == EEXIST) return Created{};
      return sys_error("create lock", path, err);
    }
    return Created{std::move(fd)};
  }

  static Error busy(const std::string& path, const LockInfo& info) {
    return Error{Errc::busy, fmt::format("{} is locked: {}", path, info.reason)};
  }

  detail::UniqueFd fd_;
  std::string path_;
  std::optional<LockInfo> previous_;
  bool flock_ = false;  // an LNL lock (try_acquire_flock)
};


}  // namespace neffcache
