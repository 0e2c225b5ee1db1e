// Definitions of cache/lock.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/lock.hpp>

#include <sys/file.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::string lock_record(const LockOwner& o) {
  nlohmann::ordered_json j{{"neffcache_lock", 1},     {"host", o.process.host},
                           {"boot_id", o.process.boot_id}, {"pid", o.process.pid},
                           {"start_time", o.process.start_time}, {"instance", o.instance}};
  return j.dump() + "\n";
}

NEFFCACHE_DECL std::optional<LockOwner> parse_lock_record(std::string_view text) {
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

NEFFCACHE_DECL std::string read_fd(int fd) {
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

NEFFCACHE_DECL bool set_ofd_lock(int fd, short type) {
  struct flock fl {};
  fl.l_type = type;
  fl.l_whence = SEEK_SET;
  return retry_eintr([&] { return ::fcntl(fd, F_OFD_SETLK, &fl); }) == 0;
}

NEFFCACHE_DECL bool kernel_lock_held_elsewhere(int fd) {
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (::fcntl(fd, F_OFD_GETLK, &fl) != 0) return false;
  return fl.l_type != F_UNLCK;
}

NEFFCACHE_DECL LockInfo judge_lock(bool kernel_locked, std::optional<LockOwner> owner,
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

NEFFCACHE_DECL bool proc_locks_list_flock(std::string_view locks, const struct stat& st) {
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

NEFFCACHE_DECL Result<LockInfo> inspect_lock_at(int dir_fd, const std::string& name, const LockOptions& opts) {
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

NEFFCACHE_DECL FlockHolder flock_holder_at(int dir_fd, const std::string& name) {
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

NEFFCACHE_DECL bool lock_held_at(int dir_fd, const std::string& name, const EntryFiles& files,
                                 const LockOptions& opts) {
  if (files.is_lnl()) return flock_held_at(dir_fd, name);
  auto info = inspect_lock_at(dir_fd, name, opts);
  return !info || info->state == LockState::live;
}

NEFFCACHE_DECL bool client_lock_held_at(int dir_fd, const std::string& name, const EntryFiles& files) {
  if (files.is_lnl()) return flock_holder_at(dir_fd, name) == FlockHolder::another_process;
  if (!files.has_lock()) return false;
  auto lock = inspect_lock_at(dir_fd, name);
  return lock && lock->state == LockState::live && !lock->owner;
}

NEFFCACHE_DECL EntryState entry_state(const EntryRef& e, const LockOptions& opts) {
  return classify(e.files, [&] { return lock_held_at(e.dir_fd, e.files.lock_name(), e.files, opts); });
}

NEFFCACHE_DECL std::string entry_lock_path(const std::string& entry_dir, const EntryFiles& files) {
  if (!files.is_lnl()) return entry_dir + "/" + files.lock_name();
  auto dir = std::filesystem::path(entry_dir).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();  // a trailing '/'
  return (dir.parent_path() / lnl_lock_name(files.key)).string();
}

NEFFCACHE_DECL bool entry_locked(const std::string& entry_dir, const EntryFiles& files, const LockOptions& opts) {
  return lock_held_at(AT_FDCWD, entry_lock_path(entry_dir, files), files, opts);
}

NEFFCACHE_DECL EntryLock& EntryLock::operator=(EntryLock&& o) noexcept {
  if (this != &o) {
    release();
    fd_ = std::move(o.fd_);
    path_ = std::move(o.path_);
    previous_ = std::move(o.previous_);
    flock_ = o.flock_;
  }
  return *this;
}

NEFFCACHE_DECL Result<EntryLock> EntryLock::try_acquire(const std::string& path, const LockOptions& opts) {
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

NEFFCACHE_DECL Result<EntryLock> EntryLock::try_acquire_flock(const std::string& path) {
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

NEFFCACHE_DECL Result<EntryLock> EntryLock::try_acquire_entry(const std::string& entry_dir, const EntryFiles& files,
                                                              const LockOptions& opts) {
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
  const std::string holder = (std::filesystem::path(path).parent_path() / lnl_holder_name(files.key)).string();
  if (auto w = detail::write_file_atomic(holder, lnl_holder_record(), 0644, owner); !w)
    return w.error();  // (the lock is released)
  return lock;
}

NEFFCACHE_DECL Result<EntryLock> EntryLock::acquire(const std::string& path,
                                                    std::chrono::steady_clock::time_point deadline,
                                                    const LockOptions& opts) {
  for (;;) {
    auto r = try_acquire(path, opts);
    if (r || r.error().code != Errc::busy) return r;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline)
      return Error{Errc::timed_out, fmt::format("gave up waiting: {}", r.error().message)};
    std::this_thread::sleep_for(std::min<std::chrono::steady_clock::duration>(opts.poll_interval, deadline - now));
  }
}

NEFFCACHE_DECL Result<void> EntryLock::heartbeat() {
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

NEFFCACHE_DECL void EntryLock::release() {
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

NEFFCACHE_DECL Result<EntryLock::Created> EntryLock::create(const std::string& path, const LockOwner& me) {
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

NEFFCACHE_DECL Error EntryLock::busy(const std::string& path, const LockInfo& info) {
  return Error{Errc::busy, fmt::format("{} is locked: {}", path, info.reason)};
}

}  // namespace neffcache
