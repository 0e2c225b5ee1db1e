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

NEFFCACHE_DECL Result<std::string> commit_neff(const std::string& entry_dir, const std::string& tmp,
                                               const std::string& xxh3, nlohmann::ordered_json meta,
                                               const std::optional<FileOwner>& owner, const EntryFiles& names) {
  const std::string path = fmt::format("{}/{}", entry_dir, names.neff_name());
  const std::string meta_path = fmt::format("{}/{}", entry_dir, k_meta_file);
  if (sys::rename(tmp.c_str(), path.c_str()) != 0) {
    Error e = sys_error("publish", path);
    sys::unlink(tmp.c_str());
    return e;
  }
  // The NEFF is in place: a failure from here on takes it away again, so that no NEFF
  // stands without its marker (the next attempt publishes anew).
  auto undo = [&](Error e) {
    sys::unlink(meta_path.c_str());
    sys::unlink(path.c_str());
    return e;
  };
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return undo(sys_error("stat", path));
  meta["size"] = st.st_size;
  meta["xxh3"] = xxh3;
  if (auto m = write_file_atomic(meta_path, meta.dump(2) + "\n", 0644, owner); !m) return undo(m.error());
  std::string marker;
  if (names.is_lnl()) {
    auto now = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch());
    marker = lnl_marker(now.count(), static_cast<uint64_t>(st.st_size));
  }
  if (auto d = write_file_atomic(fmt::format("{}/{}", entry_dir, names.done_name()), marker, 0644, owner); !d)
    return undo(d.error());
  fsync_dir(entry_dir);
  return path;
}

NEFFCACHE_DECL std::string neff_tmp_name(const std::string& entry_dir) {
  return fmt::format("{}/{}-neff-{}", entry_dir, k_private_prefix, random_hex64());
}

NEFFCACHE_DECL Result<std::string> publish(const std::string& entry_dir, const std::string& neff,
                                           nlohmann::ordered_json meta, const std::optional<FileOwner>& owner,
                                           const EntryFiles& names, const std::string& compiler_log) {
  // (The kernel applies the umask to the mode. Reading it with umask() would change it
  // for a moment, for every thread of the process.)
  const mode_t mode = 0666 & ~S_IWOTH;
  if (names.is_lnl() && !compiler_log.empty() && ::access(compiler_log.c_str(), F_OK) == 0) {
    const std::string tmp = fmt::format("{}/{}-log-{}", entry_dir, k_private_prefix, random_hex64());
    if (auto c = copy_file_hashed(compiler_log, tmp, mode, owner); !c) return c.error();
    const std::string log = fmt::format("{}/{}", entry_dir, k_lnl_log_file);
    if (sys::rename(tmp.c_str(), log.c_str()) != 0) {
      Error e = sys_error("publish", log);
      sys::unlink(tmp.c_str());
      return e;
    }
  }
  const std::string tmp = neff_tmp_name(entry_dir);
  auto hash = copy_file_hashed(neff, tmp, mode, owner);
  if (!hash) return hash.error();
  return commit_neff(entry_dir, tmp, xxh3_hex(*hash), std::move(meta), owner, names);
}

}  // namespace detail

NEFFCACHE_DECL void remove_publish_leftovers(const std::string& entry_dir) {
  const std::string neff = fmt::format("{}-neff-", k_private_prefix), log = fmt::format("{}-log-", k_private_prefix);
  std::vector<std::string> doomed;
  std::error_code ec;
  for (const auto& f : std::filesystem::directory_iterator(entry_dir, ec)) {
    const std::string name = f.path().filename().string();
    if (name.starts_with(neff) || name.starts_with(log)) doomed.push_back(f.path().string());
  }
  for (const auto& path : doomed) sys::unlink(path.c_str());
}

}  // namespace neffcache
