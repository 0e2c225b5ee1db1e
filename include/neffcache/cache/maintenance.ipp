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

NEFFCACHE_DECL std::vector<std::string> result_names(const EntryFiles& files) {
  std::vector<std::string> names{std::string(files.done_name()), files.neff_name(), std::string(files.failure_name()),
                                 std::string(k_meta_file)};
  if (files.is_lnl()) names.emplace_back(k_lnl_log_file);
  return names;
}

}  // namespace detail

NEFFCACHE_DECL Result<bool> clear_failure(const EntryPaths& e, const LockOptions& opts) {
  auto locked = detail::lock_entry(e, opts);
  if (!locked) return locked.error();
  if (!locked->files.failed()) return false;
  if (auto r = detail::unlink_all(e.view, {std::string(locked->files.failure_name())}); !r) return r.error();
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
  return detail::unlink_all(e.view, detail::result_names(locked->files));
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
  auto text = detail::read_file(fmt::format("{}/{}", entry_dir, k_meta_file));
  auto meta = text ? nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false) : nlohmann::json();
  bool recorded = meta.is_object() && meta.contains("size") && meta.contains("xxh3") && meta["xxh3"].is_string();
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
