// Changing entries safely while other processes use the cache: clearing failures, stale
// locks and results, removing entries. Every change that could race a compile is made
// under the entry lock, so a live compile is never disturbed: it is left alone with a
// reason (Errc::busy).
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// One entry as maintenance sees it. On a neffcachefs mount the lock is taken in the
// backing store (as every daemon and tool does) while files are removed through the
// mount, so that the kernel forgets them at once and the daemon lets go of their space.
// On a plain cache both are the same folder.
struct EntryPaths {
  std::string backing;  // the entry folder in the backing store
  std::string view;     // the same folder as clients see it

  static EntryPaths plain(const std::string& dir) { return {dir, dir}; }
};

namespace detail {

// Removes `names` from `dir`, in that order; a name already gone is fine.
inline Result<void> unlink_all(const std::string& dir, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    std::string path = fmt::format("{}/{}", dir, n);
    if (sys::unlink(path.c_str()) != 0 && errno != ENOENT) return sys_error("remove", path);
  }
  return {};
}

// Takes the entry's lock (a stale one is taken over), or Errc::busy with the holder.
inline Result<EntryLock> lock_entry(const EntryPaths& e, const LockOptions& opts) {
  auto files = read_entry_files(e.backing);
  if (!files) return files.error();
  return EntryLock::try_acquire_entry(e.backing, *files, opts);
}

}  // namespace detail

// Forgets a recorded failure (model.log without model.neff) so that the entry compiles
// again. False when there was none.
inline Result<bool> clear_failure(const EntryPaths& e, const LockOptions& opts = {}) {
  auto lock = detail::lock_entry(e, opts);
  if (!lock) return lock.error();
  auto files = read_entry_files(e.backing);
  if (!files) return files.error();
  if (!files->failed()) return false;
  if (auto r = detail::unlink_all(e.view, {std::string(k_log_file)}); !r) return r.error();
  return true;
}

// Removes the entry's lock when its owner is gone (by taking it over and releasing it,
// the same protocol every holder follows, so a lock that turns live meanwhile is never
// removed). Returns what the lock was; Errc::busy, naming the holder, when it is live;
// Errc::not_found when there is no lock.
inline Result<LockInfo> clear_stale_lock(const EntryPaths& e, const LockOptions& opts = {}) {
  auto files = read_entry_files(e.backing);
  if (!files) return files.error();
  if (!files->has_lock()) return Error{Errc::not_found, fmt::format("{} has no lock", e.backing)};
  auto lock = EntryLock::try_acquire_entry(e.backing, *files, opts);
  if (!lock) return lock.error();
  LockInfo was = lock->previous().value_or(LockInfo{});
  lock->release();
  return was;
}

// Removes the compile's results (model.done first, so the entry stops being done at
// once, then model.neff, model.log and our metadata), keeping the HLO and flags: the
// entry is pending again.
inline Result<void> clear_results(const EntryPaths& e, const LockOptions& opts = {}) {
  auto lock = detail::lock_entry(e, opts);
  if (!lock) return lock.error();
  return detail::unlink_all(e.view, {std::string(k_done_file), std::string(k_neff_file), std::string(k_log_file),
                                     std::string(k_meta_file)});
}

// Removes a whole entry folder. Files that appear meanwhile (a writer starting anew)
// keep the folder; that is not an error.
inline Result<void> remove_entry(const EntryPaths& e, const LockOptions& opts = {}) {
  auto lock = detail::lock_entry(e, opts);
  if (!lock) return lock.error();
  // Results first, as in clear_results, so that no reader ever sees done without a NEFF.
  auto r = detail::unlink_all(e.view, {std::string(k_done_file), std::string(k_neff_file)});
  if (!r) return r;
  std::vector<std::string> rest;
  const std::string lock_name = lock->path().substr(lock->path().rfind('/') + 1);
  int fd = detail::open_dir_at(AT_FDCWD, e.backing.c_str());
  if (fd < 0) return sys_error("open entry", e.backing);
  auto listed = detail::list_dir(fd, e.backing, [&](std::string_view name, bool) {
    if (name != lock_name) rest.emplace_back(name);
  });
  if (!listed) return listed;
  if (r = detail::unlink_all(e.view, rest); !r) return r;
  lock->release();
  ::rmdir(e.view.c_str());
  return {};
}

enum class NeffCheck {
  ok,          // the NEFF has the size and checksum recorded when it was published
  broken,      // model.done without a NEFF, or a NEFF that differs from its record
  unrecorded,  // no record to check against (published by another tool): present, not empty
};

struct NeffVerdict {
  NeffCheck check = NeffCheck::ok;
  std::string why;  // for broken: what is wrong
};

// Checks the published NEFF of an entry that has model.done against the size and xxh3
// recorded in .neffcache-meta.json at publication. Reads the whole NEFF.
inline NeffVerdict verify_neff(const std::string& entry_dir) {
  const std::string neff = fmt::format("{}/{}", entry_dir, k_neff_file);
  struct stat st {};
  if (::stat(neff.c_str(), &st) != 0) return {NeffCheck::broken, "model.done without model.neff"};
  auto text = detail::read_file(fmt::format("{}/{}", entry_dir, k_meta_file));
  auto meta = text ? nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
  if (!meta.is_object() || !meta.contains("size") || !meta.contains("xxh3") || !meta["xxh3"].is_string()) {
    if (st.st_size == 0) return {NeffCheck::broken, "model.neff is empty"};
    return {NeffCheck::unrecorded, ""};
  }
  if (meta["size"] != st.st_size)
    return {NeffCheck::broken, fmt::format("model.neff has {} bytes, {} were published", st.st_size, meta["size"].dump())};
  auto hash = detail::file_xxh3(neff);
  if (!hash) return {NeffCheck::broken, hash.error().message};
  if (const std::string hex = detail::xxh3_hex(*hash); hex != meta["xxh3"].get<std::string>())
    return {NeffCheck::broken, fmt::format("model.neff has checksum {}, {} was published", hex,
                                           meta["xxh3"].get<std::string>())};
  return {};
}

}  // namespace neffcache
