// Definitions of cache/maintenance.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/maintenance.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL Result<void> unlink_all(const std::string& dir, const std::vector<std::string>& names) {
  for (const auto& n : names) {
    std::string path = fmt::format("{}/{}", dir, n);
    if (sys::unlink(path.c_str()) != 0 && errno != ENOENT) return sys_error("remove", path);
  }
  return {};
}

NEFFCACHE_DECL Result<LockedEntry> lock_entry(const EntryPaths& e, const LockOptions& opts) {
  auto files = read_entry_files(e.backing);
  if (!files) return files.error();
  auto lock = EntryLock::try_acquire_entry(e.backing, *files, opts);
  if (!lock) return lock.error();
  files = read_entry_files(e.backing);
  if (!files) return files.error();
  return LockedEntry{std::move(*lock), std::move(*files)};
}

NEFFCACHE_DECL void remove_own_results(const std::string& entry_dir) {
  if (!EntryFiles::of_entry_path(entry_dir).is_lnl()) return;  // (a Neuron entry's are in it: result_names)
  const OwnFiles own = own_files(entry_dir);
  for (const auto& path : {own.record, own.failure, own.compile_log}) sys::unlink(path.c_str());
}

NEFFCACHE_DECL std::vector<std::string> result_names(const EntryFiles& files) {
  std::vector<std::string> names{std::string(files.done_name()), files.neff_name(), std::string(files.failure_name()),
                                 std::string(k_meta_file)};
  if (files.is_lnl()) names.emplace_back(k_lnl_log_file);
  return names;
}

}  // namespace detail

namespace detail {

NEFFCACHE_DECL bool is_old_publish_temporary(std::string_view name, const EntryFiles& files) {
  for (std::string_view copied : {"-neff-", "-log-"})  // a NEFF or a log being copied in
    if (name.starts_with(k_private_prefix) && name.substr(k_private_prefix.size()).starts_with(copied)) return true;
  // A marker or a record being written whole ("<its name>.neffcache-tmp.<hex>").
  for (std::string_view written : {files.done_name(), k_meta_file})
    if (name.starts_with(written) && name.substr(written.size()).starts_with(".neffcache-tmp.")) return true;
  return false;
}

NEFFCACHE_DECL bool has_legacy_own_files(std::string_view name, const EntryFiles& files) {
  return files.is_lnl() && (name == k_meta_file || name == k_lnl_failure_file || name == k_compile_log_file ||
                            is_old_publish_temporary(name, files));
}

}  // namespace detail

NEFFCACHE_DECL void move_legacy_own_files(const std::string& entry_dir) {
  const EntryFiles names = EntryFiles::of_entry_path(entry_dir);
  if (!names.is_lnl()) return;
  const OwnFiles own = own_files(entry_dir);
  // A record moves out unless a newer one is there; one that cannot move stays (and is read
  // where it is).
  auto move_out = [&](std::string_view name, const std::string& to) {
    const std::string from = fmt::format("{}/{}", entry_dir, name);
    struct stat st {};
    if (::lstat(from.c_str(), &st) != 0) return;
    if (::lstat(to.c_str(), &st) == 0) sys::unlink(from.c_str());
    else if (own.make()) sys::rename(from.c_str(), to.c_str());
  };
  move_out(k_meta_file, own.record);
  move_out(k_lnl_failure_file, own.failure);
  int fd = detail::open_dir_at(AT_FDCWD, entry_dir.c_str());
  if (fd < 0) return;
  std::vector<std::string> doomed;
  (void)detail::list_dir(fd, entry_dir, [&](std::string_view name, bool) {
    if (name == k_compile_log_file || detail::is_old_publish_temporary(name, names)) doomed.emplace_back(name);
  });
  for (const auto& name : doomed) sys::unlink(fmt::format("{}/{}", entry_dir, name).c_str());
}

NEFFCACHE_DECL std::size_t move_own_files_out(const std::string& root, const std::function<bool()>& stop,
                                              const LockOptions& opts) {
  // Once a pass found every entry clean, no later start walks them again: what we write
  // now goes where own_files says.
  const std::string done = fmt::format("{}/.moved-out", lnl_own_dir(root));
  struct stat st {};
  if (::lstat(done.c_str(), &st) == 0) return 0;
  // (LNL entries are the root's key folders: no walk of the Neuron entries.)
  std::vector<std::string> keys;
  int root_fd = detail::open_dir_at(AT_FDCWD, root.c_str());
  if (root_fd < 0) return 0;
  (void)detail::list_dir(root_fd, root, [&](std::string_view name, bool is_dir) {
    if (is_dir && is_lnl_key(name)) keys.emplace_back(name);
  });
  std::size_t moved = 0;
  bool whole = true;
  for (const auto& key : keys) {
    if (stop && stop()) return moved;
    const std::string dir = fmt::format("{}/{}", root, key);
    const EntryFiles names = EntryFiles::lnl(key);
    int fd = detail::open_dir_at(AT_FDCWD, dir.c_str());
    if (fd < 0) continue;
    bool any = false;
    (void)detail::list_dir(fd, dir, [&](std::string_view name, bool) { any = any || detail::has_legacy_own_files(name, names); });
    if (!any) continue;
    auto files = read_entry_files(dir);
    if (!files) continue;
    auto lock = EntryLock::try_acquire_entry(dir, *files, opts);
    if (!lock) {
      whole = false;  // its next compile moves them
      continue;
    }
    move_legacy_own_files(dir);
    ++moved;
  }
  if (whole && !keys.empty() && detail::make_dirs(lnl_own_dir(root))) (void)detail::write_file_atomic(done, "");
  return moved;
}

NEFFCACHE_DECL Result<bool> clear_failure(const EntryPaths& e, const LockOptions& opts) {
  auto locked = detail::lock_entry(e, opts);
  if (!locked) return locked.error();
  if (!locked->files.failed()) return false;
  // (An LNL entry of an earlier version may have its record in the folder.)
  if (auto r = detail::unlink_all(e.view, {std::string(locked->files.failure_name())}); !r) return r.error();
  if (locked->files.is_lnl()) sys::unlink(own_files(e.backing).failure.c_str());
  return true;
}

NEFFCACHE_DECL Result<LockInfo> clear_stale_lock(const EntryPaths& e, const LockOptions& opts) {
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

NEFFCACHE_DECL Result<void> clear_results(const EntryPaths& e, const LockOptions& opts) {
  auto locked = detail::lock_entry(e, opts);
  if (!locked) return locked.error();
  auto r = detail::unlink_all(e.view, detail::result_names(locked->files));
  if (r) detail::remove_own_results(e.backing);
  return r;
}

NEFFCACHE_DECL Result<void> remove_entry(const EntryPaths& e, const LockOptions& opts) {
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
  detail::remove_own_results(e.backing);
  lock.release();
  ::rmdir(e.view.c_str());
  return {};
}

namespace detail {

NEFFCACHE_DECL std::optional<uint64_t> lnl_marker_size(const std::string& entry_dir, const EntryFiles& files) {
  if (!files.is_lnl()) return std::nullopt;
  auto text = read_file(fmt::format("{}/{}", entry_dir, files.done_name()));
  return text ? lnl_marker_neff_size(*text) : std::nullopt;
}

}  // namespace detail

NEFFCACHE_DECL NeffVerdict verify_neff(const std::string& entry_dir, const EntryFiles& files) {
  const std::string name = files.neff_name();
  const std::string neff = fmt::format("{}/{}", entry_dir, name);
  struct stat st {};
  if (::stat(neff.c_str(), &st) != 0)
    return {NeffCheck::broken, fmt::format("{} without {}", files.done_name(), name)};
  const auto size = static_cast<uint64_t>(st.st_size);
  const auto marked = detail::lnl_marker_size(entry_dir, files);
  if (marked && *marked != size)
    return {NeffCheck::broken, fmt::format("{} has {} bytes, its {} says {}", name, size, files.done_name(), *marked)};
  const auto meta = detail::read_entry_meta(entry_dir);
  bool recorded = meta.contains("size") && meta.contains("xxh3") && meta["xxh3"].is_string();
  if (recorded && marked && meta["size"] != *marked) recorded = false;
  if (!recorded) {
    if (size == 0) return {NeffCheck::broken, fmt::format("{} is empty", name)};
    return {marked ? NeffCheck::ok : NeffCheck::unrecorded, ""};
  }
  if (meta["size"] != st.st_size)
    return {NeffCheck::broken,
            fmt::format("{} has {} bytes, {} were published", name, st.st_size, meta["size"].dump())};
  auto hash = detail::file_xxh3(neff);
  if (!hash) return {NeffCheck::broken, hash.error().message};
  if (const std::string hex = detail::xxh3_hex(*hash); hex != meta["xxh3"].get<std::string>())
    return {NeffCheck::broken,
            fmt::format("{} has checksum {}, {} was published", name, hex, meta["xxh3"].get<std::string>())};
  return {};
}

NEFFCACHE_DECL NeffVerdict verify_neff(const std::string& entry_dir) {
  auto files = read_entry_files(entry_dir);
  if (!files) return {NeffCheck::broken, files.error().message};
  return verify_neff(entry_dir, *files);
}

}  // namespace neffcache
