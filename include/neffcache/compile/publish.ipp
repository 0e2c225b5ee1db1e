// Definitions of compile/publish.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/publish.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <filesystem>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::string entry_name(const std::string& entry_dir) {
  return std::filesystem::path(entry_dir).filename().string();
}

NEFFCACHE_DECL Result<uint64_t> copy_hashed(int in, const std::string& from, int out, const std::string& to) {
  return fd_xxh3(in, from, [&](std::string_view chunk) { return write_all(out, chunk, to); });
}

NEFFCACHE_DECL Result<void> copy_into_place(int in, const std::string& from, const std::string& to,
                                            std::string_view xxh3, Durable durable) {
  const std::string tmp = fmt::format("{}.neffcache-{}", to, random_hex64());
  UniqueFd out(sys::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!out) return sys_error("create", tmp);
  auto fail = [&](Error e) -> Result<void> {
    sys::unlink(tmp.c_str());
    return e;
  };
  auto h = copy_hashed(in, from, out.get(), tmp);
  if (!h) return fail(h.error());
  if (!xxh3.empty() && xxh3_hex(*h) != xxh3)
    return fail(Error{Errc::io, fmt::format("{}: the NEFF changed while it was copied", from)});
  if (durable == Durable::yes && sys::fsync(out.get()) != 0) return fail(sys_error("fsync", tmp));
  out.reset();
  if (sys::rename(tmp.c_str(), to.c_str()) != 0) return fail(sys_error("rename", to));
  return {};
}

NEFFCACHE_DECL Result<uint64_t> copy_file_hashed(const std::string& from, const std::string& to, mode_t mode,
                                                 const std::optional<FileOwner>& owner) {
  auto opened = open_regular(from);
  if (!opened) return opened.error();
  UniqueFd in = std::move(*opened);
  UniqueFd out(sys::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode));
  if (!out) return sys_error("create", to);
  give(out.get(), owner);
  auto fail = [&](Error e) -> Result<uint64_t> {
    sys::unlink(to.c_str());
    return e;
  };
  auto h = copy_hashed(in.get(), from, out.get(), to);
  if (!h) return fail(h.error());
  if (sys::fsync(out.get()) != 0) return fail(sys_error("fsync", to));
  return h;
}

NEFFCACHE_DECL void remove_tree_at(int parent, const std::string& name, int depth) {
  UniqueFd dir(depth > 0 ? open_dir_at(parent, name.c_str()) : -1);
  std::vector<std::string> inside;
  if (dir) (void)list_dir(::dup(dir.get()), name, [&](std::string_view n, bool) { inside.emplace_back(n); });
  for (const auto& n : inside)  // unlinkat tells a folder by EISDIR, whatever the listing said
    if (::unlinkat(dir.get(), n.c_str(), 0) != 0 && errno == EISDIR) remove_tree_at(dir.get(), n, depth - 1);
  ::unlinkat(parent, name.c_str(), AT_REMOVEDIR);
}

NEFFCACHE_DECL std::optional<FileOwner> entry_owner(const std::string& hlo_path) {
  struct stat st {};
  if (::geteuid() != 0 || ::lstat(hlo_path.c_str(), &st) != 0) return std::nullopt;
  return FileOwner{st.st_uid, st.st_gid};
}

NEFFCACHE_DECL void fsync_dir(const std::string& dir) {
  UniqueFd fd(sys::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (fd) sys::fsync(fd.get());
}

NEFFCACHE_DECL Result<void> write_marker(const std::string& entry_dir, const EntryFiles& names, uint64_t neff_bytes,
                                         const std::optional<FileOwner>& owner) {
  const std::string marker = names.is_lnl() ? lnl_marker(unix_time_now(), neff_bytes) : std::string();
  const OwnFiles own = own_files(entry_dir);
  if (auto m = own.make(); !m) return m;
  return write_file_atomic(fmt::format("{}/{}", entry_dir, names.done_name()), marker, k_marker_mode, owner,
                           own.temporary("marker"));
}

NEFFCACHE_DECL Result<std::string> commit_neff(const std::string& entry_dir, const std::string& tmp,
                                               const std::string& xxh3, nlohmann::ordered_json meta,
                                               const std::optional<FileOwner>& owner, const EntryFiles& names) {
  const std::string path = fmt::format("{}/{}", entry_dir, names.neff_name());
  const OwnFiles own = own_files(entry_dir);
  auto fail = [&](Error e) {
    sys::unlink(tmp.c_str());
    return e;
  };
  // The record first, naming this very file (the rename keeps its inode and mtime): a
  // crash after the rename leaves a NEFF that it describes, a publish to finish, where
  // any other NEFF without its marker is a leftover.
  struct stat st {};
  if (::lstat(tmp.c_str(), &st) != 0) return fail(sys_error("stat", tmp));
  describe_neff(meta, st);
  meta["xxh3"] = xxh3;
  if (auto m = own.make(); !m) return fail(m.error());
  if (auto m = write_file_atomic(own.record, meta.dump(2) + "\n", 0644, owner, own.temporary("meta")); !m)
    return fail(m.error());
  fsync_dir(own.dir);
  if (sys::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = sys_error("publish", path);
    sys::unlink(own.record.c_str());
    return fail(e);
  }
  // The NEFF is in place: a failure from here on takes it away again, so that no NEFF
  // stands without its marker (the next attempt publishes anew).
  if (auto d = write_marker(entry_dir, names, static_cast<uint64_t>(st.st_size), owner); !d) {
    sys::unlink(own.record.c_str());
    sys::unlink(path.c_str());
    return d.error();
  }
  fsync_dir(entry_dir);
  return path;
}

NEFFCACHE_DECL std::string neff_tmp_name(const std::string& entry_dir) {
  const OwnFiles own = own_files(entry_dir);
  (void)own.make();  // (a folder that cannot be made fails the create, which says why)
  return own.temporary("neff");
}

NEFFCACHE_DECL Result<std::string> publish(const std::string& entry_dir, const std::string& neff,
                                           nlohmann::ordered_json meta, const std::optional<FileOwner>& owner,
                                           const EntryFiles& names, const std::string& compiler_log) {
  // (The kernel applies the umask to the mode. Reading it with umask() would change it
  // for a moment, for every thread of the process.)
  const mode_t mode = k_neff_mode;
  const OwnFiles own = own_files(entry_dir);
  if (auto m = own.make(); !m) return m.error();
  if (names.is_lnl() && !compiler_log.empty() && ::access(compiler_log.c_str(), F_OK) == 0) {
    const std::string tmp = own.temporary("log");
    if (auto c = copy_file_hashed(compiler_log, tmp, mode, owner); !c) return c.error();
    const std::string log = fmt::format("{}/{}", entry_dir, k_lnl_log_file);
    if (sys::rename(tmp.c_str(), log.c_str()) != 0) {
      Error e = sys_error("publish", log);
      sys::unlink(tmp.c_str());
      return e;
    }
  }
  const std::string tmp = own.temporary("neff");
  auto hash = copy_file_hashed(neff, tmp, mode, owner);
  if (!hash) return hash.error();
  return commit_neff(entry_dir, tmp, xxh3_hex(*hash), std::move(meta), owner, names);
}

}  // namespace detail

namespace detail {
// What publishers name their temporaries (OwnFiles::temporary), after the prefix.
inline constexpr std::string_view k_temporaries[] = {"neff-", "log-", "marker-", "meta-"};
}  // namespace detail

NEFFCACHE_DECL void remove_publish_leftovers(const std::string& entry_dir) {
  const OwnFiles own = own_files(entry_dir);
  const std::string prefix = std::filesystem::path(own.tmp_prefix).filename().string();
  auto remove_in = [&](const std::string& dir, auto&& doomed_name) {
    std::vector<std::string> doomed;
    std::error_code ec;
    for (const auto& f : std::filesystem::directory_iterator(dir, ec))
      if (doomed_name(f.path().filename().string())) doomed.push_back(f.path().string());
    for (const auto& path : doomed) sys::unlink(path.c_str());
  };
  remove_in(own.dir, [&](std::string_view name) {
    if (!name.starts_with(prefix)) return false;
    for (std::string_view what : detail::k_temporaries)
      if (name.substr(prefix.size()).starts_with(what)) return true;
    return false;
  });
  // What an earlier version's publisher left in the entry, and (LNL) our files it kept there.
  const EntryFiles names = EntryFiles::of_entry_path(entry_dir);
  remove_in(entry_dir, [&](std::string_view name) { return detail::is_old_publish_temporary(name, names); });
  move_legacy_own_files(entry_dir);
}

NEFFCACHE_DECL bool publish_interrupted(const std::string& entry_dir, const EntryFiles& files) {
  if (!files.has(EntryFile::neff) || files.has(EntryFile::done) || !files.has_job()) return false;
  struct stat neff {}, meta_st {};
  if (::lstat(fmt::format("{}/{}", entry_dir, files.neff_name()).c_str(), &neff) != 0 || !S_ISREG(neff.st_mode))
    return false;
  const auto meta = detail::read_entry_meta(entry_dir, &meta_st);
  // (Only a record that names its file's mtime: one of an earlier version, written after
  // the rename, may describe a leftover of the same size.)
  return meta.contains("mtime_ns") && meta.contains("xxh3") && detail::record_describes(meta, meta_st, neff);
}

NEFFCACHE_DECL Result<bool> finish_publish(const std::string& entry_dir, const EntryFiles& files,
                                           const std::optional<detail::FileOwner>& owner) {
  if (!publish_interrupted(entry_dir, files)) return false;
  const auto meta = detail::read_entry_meta(entry_dir);
  const std::string neff = fmt::format("{}/{}", entry_dir, files.neff_name());
  auto hash = detail::file_xxh3(neff);
  if (!hash) return hash.error();
  if (detail::xxh3_hex(*hash) != meta["xxh3"]) return false;
  struct stat st {};
  if (::stat(neff.c_str(), &st) != 0) return sys_error("stat", neff);
  if (auto d = detail::write_marker(entry_dir, files, static_cast<uint64_t>(st.st_size), owner); !d) return d.error();
  detail::fsync_dir(entry_dir);
  return true;
}

}  // namespace neffcache
