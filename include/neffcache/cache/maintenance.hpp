// Changing entries safely while other processes use the cache: clearing failures, stale
// locks and results, removing entries. Every change that could race a compile is made
// under the entry lock, so a live compile is never disturbed: it is left alone with a
// reason (Errc::busy). Entries of either dialect (layout.hpp): files are named by their
// role (EntryFiles), and an LNL entry's lock is the client's flock beside its folder.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lnl.hpp>
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

// A locked entry: its lock, and its files as they are under it.
struct LockedEntry {
  EntryLock lock;
  EntryFiles files;
};

// Takes the entry's lock (a stale one is taken over), or Errc::busy with the holder; then
// lists the entry again, since the holder before us may have changed it.
inline Result<LockedEntry> lock_entry(const EntryPaths& e, const LockOptions& opts) {
  auto files = read_entry_files(e.backing);
  if (!files) return files.error();
  auto lock = EntryLock::try_acquire_entry(e.backing, *files, opts);
  if (!lock) return lock.error();
  files = read_entry_files(e.backing);
  if (!files) return files.error();
  return LockedEntry{std::move(*lock), std::move(*files)};
}

// What a compile leaves in an entry of `files`' dialect, the done marker first, so that
// the entry stops being done at once and no reader sees a marker without its NEFF: the
// marker, the NEFF, the failure record, our metadata; of an LNL entry the compiler's log
// too (with a NEFF and no marker it would make the entry partial).
inline std::vector<std::string> result_names(const EntryFiles& files) {
  std::vector<std::string> names{std::string(files.done_name()), files.neff_name(), std::string(files.failure_name()),
                                 std::string(k_meta_file)};
  if (files.is_lnl()) names.emplace_back(k_lnl_log_file);
  return names;
}

}  // namespace detail

// Forgets a recorded failure (model.log without model.neff; LNL: our
// .neffcache-failed.log without the marker) so that the entry compiles again. False when
// there was none.
inline Result<bool> clear_failure(const EntryPaths& e, const LockOptions& opts = {}) {
  auto locked = detail::lock_entry(e, opts);
  if (!locked) return locked.error();
  if (!locked->files.failed()) return false;
  if (auto r = detail::unlink_all(e.view, {std::string(locked->files.failure_name())}); !r) return r.error();
  return true;
}

// Removes the entry's lock when its owner is gone (by taking it over and releasing it,
// the same protocol every holder follows, so a lock that turns live meanwhile is never
// removed). Returns what the lock was; Errc::busy, naming the holder, when it is live;
// Errc::not_found when there is no lock. An LNL lock is a flock: its file alone means
// nothing (clients leave it behind), so it is never stale; Errc::busy while it is held,
// else Errc::not_found, and its file stays.
inline Result<LockInfo> clear_stale_lock(const EntryPaths& e, const LockOptions& opts = {}) {
  auto files = read_entry_files(e.backing);
  if (!files) return files.error();
  if (files->is_lnl()) {
    auto held = EntryLock::try_acquire_entry(e.backing, *files, opts);
    if (!held) return held.error();
    return Error{Errc::not_found, fmt::format("{}: no one holds its lock, there is nothing to clear", e.backing)};
  }
  if (!files->has_lock()) return Error{Errc::not_found, fmt::format("{} has no lock", e.backing)};
  auto lock = EntryLock::try_acquire_entry(e.backing, *files, opts);
  if (!lock) return lock.error();
  LockInfo was = lock->previous().value_or(LockInfo{});
  lock->release();
  return was;
}

// Removes the compile's results (model.done first, so the entry stops being done at
// once, then model.neff, model.log and our metadata; LNL: its marker, NEFF and compiler
// log, our failure record and metadata), keeping the HLO and flags (LNL: graph.hlo,
// command.txt, LNL's metadata): the entry is pending again.
inline Result<void> clear_results(const EntryPaths& e, const LockOptions& opts = {}) {
  auto locked = detail::lock_entry(e, opts);
  if (!locked) return locked.error();
  return detail::unlink_all(e.view, detail::result_names(locked->files));
}

// Removes a whole entry folder. Files that appear meanwhile (a writer starting anew)
// keep the folder; that is not an error.
inline Result<void> remove_entry(const EntryPaths& e, const LockOptions& opts = {}) {
  auto locked = detail::lock_entry(e, opts);
  if (!locked) return locked.error();
  auto& lock = locked->lock;
  // Results first, as in clear_results, so that no reader ever sees done without a NEFF.
  auto r = detail::unlink_all(e.view, {std::string(locked->files.done_name()), locked->files.neff_name()});
  if (!r) return r;
  std::vector<std::string> rest;
  // (An LNL lock is beside the folder, not in it: it stays, as its clients leave it.)
  const std::string lock_name = lock.path().substr(lock.path().rfind('/') + 1);
  int fd = detail::open_dir_at(AT_FDCWD, e.backing.c_str());
  if (fd < 0) return sys_error("open entry", e.backing);
  auto listed = detail::list_dir(fd, e.backing, [&](std::string_view name, bool) {
    if (name != lock_name) rest.emplace_back(name);
  });
  if (!listed) return listed;
  if (r = detail::unlink_all(e.view, rest); !r) return r;
  lock.release();
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

namespace detail {

// What the LNL marker of `entry_dir` says of the NEFF's size, when it says it.
inline std::optional<uint64_t> lnl_marker_size(const std::string& entry_dir, const EntryFiles& files) {
  if (!files.is_lnl()) return std::nullopt;
  auto text = read_file(fmt::format("{}/{}", entry_dir, files.done_name()));
  return text ? lnl_marker_neff_size(*text) : std::nullopt;
}

}  // namespace detail

// Checks the published NEFF of an entry whose files are `files` and that has its done
// marker: against the size and xxh3 recorded in .neffcache-meta.json at publication, and
// of an LNL entry against the size its marker records (LNL writes no checksum: a NEFF
// whose size agrees with its marker and that we did not publish is ok). Our metadata
// counts only while it describes the NEFF the marker does: a client that compiled the
// entry again since left it behind. Reads the whole NEFF.
inline NeffVerdict verify_neff(const std::string& entry_dir, const EntryFiles& files) {
  const std::string name = files.neff_name();
  const std::string neff = fmt::format("{}/{}", entry_dir, name);
  struct stat st {};
  if (::stat(neff.c_str(), &st) != 0) return {NeffCheck::broken, fmt::format("{} without {}", files.done_name(), name)};
  const auto size = static_cast<uint64_t>(st.st_size);
  const auto marked = detail::lnl_marker_size(entry_dir, files);
  if (marked && *marked != size)
    return {NeffCheck::broken, fmt::format("{} has {} bytes, its {} says {}", name, size, files.done_name(), *marked)};
  auto text = detail::read_file(fmt::format("{}/{}", entry_dir, k_meta_file));
  auto meta = text ? nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
  bool recorded = meta.is_object() && meta.contains("size") && meta.contains("xxh3") && meta["xxh3"].is_string();
  if (recorded && marked && meta["size"] != *marked) recorded = false;
  if (!recorded) {
    if (size == 0) return {NeffCheck::broken, fmt::format("{} is empty", name)};
    return {marked ? NeffCheck::ok : NeffCheck::unrecorded, ""};
  }
  if (meta["size"] != st.st_size)
    return {NeffCheck::broken, fmt::format("{} has {} bytes, {} were published", name, st.st_size, meta["size"].dump())};
  auto hash = detail::file_xxh3(neff);
  if (!hash) return {NeffCheck::broken, hash.error().message};
  if (const std::string hex = detail::xxh3_hex(*hash); hex != meta["xxh3"].get<std::string>())
    return {NeffCheck::broken,
            fmt::format("{} has checksum {}, {} was published", name, hex, meta["xxh3"].get<std::string>())};
  return {};
}

// The same for the entry folder `entry_dir`, listed now.
inline NeffVerdict verify_neff(const std::string& entry_dir) {
  auto files = read_entry_files(entry_dir);
  if (!files) return {NeffCheck::broken, files.error().message};
  return verify_neff(entry_dir, *files);
}

}  // namespace neffcache
