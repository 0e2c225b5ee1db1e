// Definitions of cache/layout.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/layout.hpp>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL bool is_lnl_key(std::string_view name) {
  if (name.size() != k_lnl_key_digits) return false;
  for (char c : name)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

NEFFCACHE_DECL std::string compiler_dir_name(std::string_view version) {
  return fmt::format("{}{}", k_compiler_dir_prefix, version);
}

NEFFCACHE_DECL std::string lnl_neff_name(std::string_view key) { return fmt::format("graph_{}.neff", key); }

NEFFCACHE_DECL std::optional<std::string_view> lnl_neff_key(std::string_view name) {
  constexpr std::string_view prefix = "graph_", suffix = ".neff";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix))
    return std::nullopt;
  const auto key = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (!is_lnl_key(key)) return std::nullopt;
  return key;
}

NEFFCACHE_DECL std::string lnl_holder_name(std::string_view key) { return fmt::format(".{}{}", key, k_lnl_holder_suffix); }

NEFFCACHE_DECL std::string lnl_lock_name(std::string_view key) { return lnl_holder_name(key) + std::string(k_lock_suffix); }

NEFFCACHE_DECL std::optional<std::string_view> lnl_lock_key(std::string_view name) {
  if (!name.starts_with('.') || !name.ends_with(k_lock_suffix)) return std::nullopt;
  name.remove_suffix(k_lock_suffix.size());
  if (!name.ends_with(k_lnl_holder_suffix)) return std::nullopt;
  const auto key = name.substr(1, name.size() - 1 - k_lnl_holder_suffix.size());
  if (!is_lnl_key(key)) return std::nullopt;
  return key;
}

NEFFCACHE_DECL std::string EntryKey::module_dir() const {
  return fmt::format("{}{}+{}", k_module_dir_prefix, graph_hash, flags_hash);
}

NEFFCACHE_DECL bool is_entry_path(std::string_view path) {
  if (is_lnl_key(path)) return true;
  auto slash = path.find('/');
  return slash != std::string_view::npos && path.starts_with(k_compiler_dir_prefix) &&
         path.substr(slash + 1).starts_with(k_module_dir_prefix) &&
         path.find('/', slash + 1) == std::string_view::npos && path.find("..") == std::string_view::npos;
}

NEFFCACHE_DECL std::optional<std::string> entry_path_in(std::string_view root, std::string_view dir) {
  if (dir.size() <= root.size() + 1 || !dir.starts_with(root) || dir[root.size()] != '/') return std::nullopt;
  std::string_view rel = dir.substr(root.size() + 1);
  if (!is_entry_path(rel)) return std::nullopt;
  return std::string(rel);
}

NEFFCACHE_DECL std::string compiler_dir_of(std::string_view entry_path) {
  while (entry_path.size() > 1 && entry_path.back() == '/') entry_path.remove_suffix(1);
  auto last = entry_path.rfind('/');
  if (last == std::string_view::npos || is_lnl_key(entry_path.substr(last + 1))) return {};
  auto dir = entry_path.substr(0, last);
  return std::string(dir.substr(dir.rfind('/') + 1));
}

NEFFCACHE_DECL Result<void> check_compiler_version(std::string_view v) {
  bool ok = !v.empty() && v != "." && v != ".." && v.size() <= 128;
  for (char c : v) ok = ok && c != '/' && c != '\0' && static_cast<unsigned char>(c) > ' ';
  if (!ok) return Error{Errc::invalid_argument, fmt::format("bad compiler version '{}'", v)};
  return {};
}

NEFFCACHE_DECL std::optional<std::string_view> EntryFiles::hlo_name() const {
  if (is_lnl()) return has(EntryFile::hlo_module) ? std::optional(k_lnl_hlo_file) : std::nullopt;
  if (has(EntryFile::hlo_module)) return k_hlo_module_file;
  if (has(EntryFile::hlo_legacy)) return k_hlo_legacy_file;
  return std::nullopt;
}

NEFFCACHE_DECL std::string EntryFiles::lock_name() const {
  if (is_lnl()) return "../" + lnl_lock_name(key);
  bool legacy = !has(EntryFile::hlo_module) &&
                (has(EntryFile::hlo_legacy) || has(EntryFile::lock_legacy));
  return fmt::format("{}{}", legacy ? k_hlo_legacy_file : k_hlo_module_file, k_lock_suffix);
}

NEFFCACHE_DECL void EntryFiles::note(std::string_view name) {
  using F = EntryFile;
  if (is_lnl()) {
    if (name == k_lnl_hlo_file) add(F::hlo_module);
    else if (name == k_lnl_command_file) add(F::flags);
    else if (name == k_lnl_metadata_file) add(F::metadata);
    else if (name == k_lnl_marker_file) add(F::done);
    else if (name == k_lnl_log_file) add(F::compiler_log);
    else if (name == k_lnl_failure_file) add(F::log);
    else if (name == k_lnl_lease_file) add(F::lock_module);
    else if (name.starts_with("graph_") && name == lnl_neff_name(key)) add(F::neff);
    return;
  }
  if (name.substr(0, 6) != "model." && name != k_compile_flags_file) return;
  if (name == k_hlo_module_file) add(F::hlo_module);
  else if (name == k_hlo_legacy_file) add(F::hlo_legacy);
  else if (name == k_compile_flags_file) add(F::flags);
  else if (name == k_neff_file) add(F::neff);
  else if (name == k_done_file) add(F::done);
  else if (name == k_log_file) add(F::log);
  else if (name == "model.hlo_module.pb.lock") add(F::lock_module);
  else if (name == "model.hlo.pb.lock") add(F::lock_legacy);
}

NEFFCACHE_DECL std::string OwnFiles::temporary(std::string_view what) const {
  return fmt::format("{}{}-{}", tmp_prefix, what, detail::random_hex64());
}

NEFFCACHE_DECL Result<void> OwnFiles::make() const {
  struct stat st {};
  if (::stat(dir.c_str(), &st) == 0) return {};
  return detail::make_dirs(dir);
}

NEFFCACHE_DECL OwnFiles own_files(std::string_view entry_dir) {
  while (entry_dir.size() > 1 && entry_dir.back() == '/') entry_dir.remove_suffix(1);
  const auto slash = entry_dir.rfind('/');
  const std::string_view name = slash == std::string_view::npos ? entry_dir : entry_dir.substr(slash + 1);
  if (!is_lnl_key(name)) {
    const std::string dir(entry_dir);
    return {dir, fmt::format("{}/{}", dir, k_meta_file), fmt::format("{}/{}", dir, k_log_file),
            fmt::format("{}/{}", dir, k_compile_log_file), fmt::format("{}/{}-", dir, k_private_prefix)};
  }
  // (A bare key is an entry path: its own files' paths are then relative to the cache.)
  const std::string dir = lnl_own_dir(slash == std::string_view::npos ? std::string_view()
                                      : slash == 0                    ? std::string_view("/")
                                                                      : entry_dir.substr(0, slash));
  return {dir, fmt::format("{}/{}.meta.json", dir, name), fmt::format("{}/{}.failed.log", dir, name),
          fmt::format("{}/{}.compile.log", dir, name), fmt::format("{}/{}.", dir, name)};
}

NEFFCACHE_DECL std::string lnl_own_dir(std::string_view root) {
  if (root.empty()) return fmt::format("{}/lnl", k_private_prefix);
  return fmt::format("{}{}{}/lnl", root, root.ends_with('/') ? "" : "/", k_private_prefix);
}

NEFFCACHE_DECL std::string own_failure_from_entry(const EntryFiles& files) {
  return files.is_lnl() ? "../" + own_files(files.key).failure : std::string();
}

NEFFCACHE_DECL std::string failure_record(std::string_view entry_dir) {
  std::string failure = own_files(entry_dir).failure;
  struct stat st {};
  if (EntryFiles::of_entry_path(entry_dir).is_lnl() && ::lstat(failure.c_str(), &st) != 0)
    if (std::string legacy = fmt::format("{}/{}", entry_dir, k_lnl_failure_file); ::lstat(legacy.c_str(), &st) == 0)
      return legacy;
  return failure;
}

NEFFCACHE_DECL bool done_at(int entry_fd, std::string_view folder_name) {
  EntryFiles files = EntryFiles::of_folder(folder_name);
  auto has = [&](const std::string& name) {
    return ::faccessat(entry_fd, name.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0 ? files.note(name), true : false;
  };
  // The marker first: most entries a walk meets that lack it cost one look.
  if (!has(std::string(files.done_name())) || !has(files.neff_name())) return false;
  if (files.is_lnl() && (!has(std::string(k_lnl_hlo_file)) || !has(std::string(k_lnl_metadata_file)))) return false;
  return files.done();
}

NEFFCACHE_DECL void note_own_files(int entry_fd, EntryFiles& files) {
  if (!files.is_lnl()) return;
  struct stat failure {}, hlo {};
  if (::fstatat(entry_fd, own_failure_from_entry(files).c_str(), &failure, AT_SYMLINK_NOFOLLOW) != 0) return;
  // A failure of the graph that is there now: one recorded before graph.hlo was written
  // again (a rank compiling the key itself, a folder made anew) says nothing of it.
  if (::fstatat(entry_fd, std::string(k_lnl_hlo_file).c_str(), &hlo, AT_SYMLINK_NOFOLLOW) == 0 &&
      detail::to_time_point(hlo.st_mtim) > detail::to_time_point(failure.st_mtim))
    return;
  files.add(EntryFile::log);
}

NEFFCACHE_DECL const char* to_string(EntryState s) {
  switch (s) {
    case EntryState::empty: return "empty";
    case EntryState::pending: return "pending";
    case EntryState::partial: return "partial";
    case EntryState::compiling: return "compiling";
    case EntryState::done: return "done";
    case EntryState::failed: return "failed";
    case EntryState::stale_lock: return "stale";
  }
  return "?";
}

NEFFCACHE_DECL std::optional<EntryState> parse_entry_state(std::string_view s) {
  for (auto st : {EntryState::empty, EntryState::pending, EntryState::partial, EntryState::compiling, EntryState::done,
                  EntryState::failed, EntryState::stale_lock})
    if (s == to_string(st)) return st;
  return std::nullopt;
}

NEFFCACHE_DECL EntryState classify(const EntryFiles& f, const std::function<bool()>& lock_is_live) {
  if (f.done()) return EntryState::done;
  if (f.is_lnl()) {
    if (lock_is_live()) return EntryState::compiling;
    if (f.failed()) return EntryState::failed;
    if (f.partial()) return EntryState::partial;
    return f.has_job() ? EntryState::pending : EntryState::empty;
  }
  if (f.has_lock()) return lock_is_live() ? EntryState::compiling : EntryState::stale_lock;
  if (f.failed()) return EntryState::failed;
  if (f.partial()) return EntryState::partial;
  if (f.has_hlo()) return EntryState::pending;
  return EntryState::empty;
}

NEFFCACHE_DECL std::string EntryRef::relative_path() const {
  return compiler_dir.empty() ? std::string(module_dir) : fmt::format("{}/{}", compiler_dir, module_dir);
}

namespace detail {

NEFFCACHE_DECL int open_dir_at(int parent, const char* name) {
  return retry_eintr([&] {
    return ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  });
}

NEFFCACHE_DECL Result<void> make_dirs(const std::string& dir) {
  for (std::size_t at = 1; at <= dir.size(); ++at) {
    if (at != dir.size() && dir[at] != '/') continue;
    std::string part = dir.substr(0, at);
    if (sys::mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return sys_error("create", part);
  }
  return {};
}

}  // namespace detail

NEFFCACHE_DECL Result<void> for_each_entry(const std::string& root,
                                           const std::function<void(const EntryRef&)>& visit) {
  int root_fd = detail::open_dir_at(AT_FDCWD, root.c_str());
  if (root_fd < 0) return sys_error("open cache root", root);
  // Lists the entry folder `name` in the folder `parent_fd` and visits it.
  auto visit_entry = [&](int parent_fd, const std::string& parent, std::string_view compiler_dir,
                         const std::string& name) {
    detail::UniqueFd mfd(detail::open_dir_at(parent_fd, name.c_str()));
    if (!mfd) return;
    EntryRef ref{compiler_dir, name, EntryFiles::of_folder(compiler_dir.empty() ? name : ""), mfd.get()};
    int list_fd = ::dup(mfd.get());
    if (list_fd < 0) return;
    auto rm = detail::list_dir(list_fd, parent + "/" + name,
                               [&](std::string_view file, bool) { ref.files.note(file); });
    if (!rm) return;
    note_own_files(mfd.get(), ref.files);
    visit(ref);
  };
  Result<void> inner_error;
  auto r = detail::list_dir(root_fd, root, [&](std::string_view cdir, bool is_dir) {
    if (!is_dir || !inner_error) return;
    if (is_lnl_key(cdir)) return visit_entry(root_fd, root, {}, std::string(cdir));
    if (!cdir.starts_with(k_compiler_dir_prefix)) return;
    std::string cname(cdir);
    int cfd = detail::open_dir_at(root_fd, cname.c_str());
    if (cfd < 0) return;  // vanished or not a folder: nothing to walk
    std::string cpath = root + "/" + cname;
    auto rc = detail::list_dir(cfd, cpath, [&](std::string_view mdir, bool mis_dir) {
      if (mis_dir && mdir.starts_with(k_module_dir_prefix)) visit_entry(cfd, cpath, cname, std::string(mdir));
    });
    if (!rc && rc.error().code != Errc::not_found) inner_error = rc.error();
  });
  if (!r) return r;
  return inner_error;
}

NEFFCACHE_DECL Result<EntryFiles> read_entry_files(const std::string& entry_dir) {
  int fd = detail::open_dir_at(AT_FDCWD, entry_dir.c_str());
  if (fd < 0) return sys_error("open entry", entry_dir);
  std::string_view dir = entry_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  EntryFiles files = EntryFiles::of_folder(dir.substr(dir.rfind('/') + 1));
  detail::UniqueFd own(::dup(fd));  // (list_dir takes fd)
  auto r = detail::list_dir(fd, entry_dir, [&](std::string_view name, bool) { files.note(name); });
  if (!r) return r.error();
  if (own) note_own_files(own.get(), files);
  return files;
}

}  // namespace neffcache
