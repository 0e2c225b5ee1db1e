// Definitions of store/directory.hpp (core/decl.hpp).
#pragma once

#include <neffcache/store/directory.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache::store {

NEFFCACHE_DECL std::optional<MountedCache> mounted_cache(const std::string& root) {
  auto text = detail::read_file(fmt::format("{}/{}/stats.json", root, k_private_prefix));
  if (!text) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("backing") || !j["backing"].is_string()) return std::nullopt;
  MountedCache m{j["backing"].get<std::string>(), {}};
  if (j.contains("layers") && j["layers"].is_array())
    for (const auto& l : j["layers"])
      if (l.is_string()) m.lowers.push_back(l.get<std::string>());
  m.read_only = j.value("read_only", false);
  return m;
}

NEFFCACHE_DECL std::unique_ptr<DirectoryStore> DirectoryStore::open(const std::string& root) {
  std::error_code ec;
  auto absolute = std::filesystem::absolute(root, ec);
  std::string view = ec ? root : absolute.lexically_normal().string();
  if (view.size() > 1 && view.back() == '/') view.pop_back();
  auto mounted = mounted_cache(view);
  if (!mounted) return std::unique_ptr<DirectoryStore>(new DirectoryStore(view, view, false, {}));
  auto store = std::unique_ptr<DirectoryStore>(
      new DirectoryStore(view, std::move(mounted->backing), true, std::move(mounted->lowers)));
  store->read_only_ = mounted->read_only;
  return store;
}

NEFFCACHE_DECL Result<std::vector<EntryInfo>> DirectoryStore::list(IfMissing if_missing) const {
  std::error_code ec;
  if (if_missing == IfMissing::empty && !std::filesystem::exists(view_, ec)) return std::vector<EntryInfo>{};
  return list_entries(index_.layers());
}

NEFFCACHE_DECL Result<Entry> DirectoryStore::named(std::string_view arg) const {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path p : {fs::path(arg), fs::path(view_) / arg}) {
    p = p.lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // a trailing '/'
    if (fs::is_regular_file(p, ec)) p = p.parent_path();
    const std::string folder = p.filename().string();
    if (!fs::is_directory(p, ec) || !is_entry_folder(folder)) continue;
    auto e = of_folder(fs::absolute(p, ec).lexically_normal().string());
    if (!e) return Error{Errc::invalid_argument, fmt::format("{}: not an entry of the cache {}", arg, view_)};
    return e;
  }
  return Error{Errc::not_found,
               fmt::format("{}: not a cache entry (a MODULE_* folder, or an LNL entry's: 32 hex digits in the cache)",
                           arg)};
}

NEFFCACHE_DECL std::string DirectoryStore::view(const Entry& e) const { return fmt::format("{}/{}", view_, e.path()); }

NEFFCACHE_DECL Result<LocalFile> DirectoryStore::local_file(const Entry& e, std::string_view name) const {
  return LocalFile(fmt::format("{}/{}", paths(e).backing, name), LocalFile::Kind::in_place);
}

NEFFCACHE_DECL Result<bool> DirectoryStore::put_graph(const Entry& e, std::string_view hlo_bytes,
                                                      const std::vector<std::string>& flags) const {
  // Our graphs are the Neuron cache's files; LNL writes its own entries.
  if (e.dialect() == Dialect::lnl)
    return Error{Errc::invalid_argument, fmt::format("{}: an LNL entry takes no graph from us", view(e))};
  // (Through a layered mount, a new entry goes to layer 0; one a lower layer has is
  // there already.)
  if (auto lower = in_lower_layer(e)) {
    if (auto f = files(e); f && f->has_hlo()) return false;
    return *lower;
  }
  const std::string dir = view(e);
  for (const auto& d : {view_, fmt::format("{}/{}", view_, e.compiler_dir()), dir})
    if (sys::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return sys_error("create", d);
  return store_graph(dir, hlo_bytes, flags);
}

NEFFCACHE_DECL Result<bool> DirectoryStore::clear_failure(const Entry& e) const {
  if (auto lower = in_lower_layer(e)) return *lower;
  auto cleared = neffcache::clear_failure(paths(e));
  if (!cleared) return cleared;
  if (auto id = index_.id_of(e.path())) {
    for (const auto& r : index_.records(*id)) {
      if (!r.failed) continue;
      if (r.entry != e.path()) {
        auto twin = at(r.entry);
        if (twin && !neffcache::clear_failure(paths(*twin))) continue;  // busy: its record stays
      }
      index_.forget(*id, r.entry);
    }
  }
  return cleared;
}

NEFFCACHE_DECL Result<void> DirectoryStore::clear_results(const Entry& e) const {
  if (auto lower = in_lower_layer(e)) return *lower;
  auto r = neffcache::clear_results(paths(e));
  if (r) index_.forget(e.path());
  return r;
}

NEFFCACHE_DECL Result<void> DirectoryStore::remove(const Entry& e) const {
  if (auto lower = in_lower_layer(e)) return *lower;
  auto r = neffcache::remove_entry(paths(e));
  if (r) index_.forget(e.path());
  return r;
}

NEFFCACHE_DECL Result<IndexUpdate> DirectoryStore::update_index(bool rebuild,
                                                                const std::vector<std::string>& default_flags) const {
  std::error_code ec;
  if (!std::filesystem::is_directory(index_.root(), ec))
    return Error{Errc::not_found, fmt::format("{}: no such cache folder", index_.root())};
  auto scan = rebuild ? rebuild_index(index_, default_flags) : index_unknown_entries(index_, SIZE_MAX, default_flags);
  return IndexUpdate{scan.entries, scan.added, scan.unreadable, 0};
}

NEFFCACHE_DECL Result<std::string> DirectoryStore::clear_stale_lock(const EntryInfo& e) const {
  if (auto lower = in_lower_layer(entry(e))) return *lower;
  auto info = neffcache::clear_stale_lock(paths(entry(e)));
  if (!info) return info.error();
  return info->reason.empty() ? std::string("its owner is gone") : info->reason;
}

NEFFCACHE_DECL void DirectoryStore::remove_empty_compiler_dirs(const std::set<std::string>& compiler_dirs) const {
  // (An empty name would be the cache itself, which stays.)
  for (const auto& c : compiler_dirs)
    if (!c.empty()) ::rmdir(fmt::format("{}/{}", view_, c).c_str());
}

NEFFCACHE_DECL Result<Entry> DirectoryStore::of_folder(const std::string& dir) const {
  for (const auto& root : {view_, backing_})
    if (auto rel = entry_path_in(root, dir)) return make_entry(*rel);
  return Error{Errc::invalid_argument, fmt::format("{}: not an entry of the cache {}", dir, view_)};
}

NEFFCACHE_DECL std::string DirectoryStore::peaks_dir() const { return fmt::format("{}/{}", backing_, k_peaks_dir); }

NEFFCACHE_DECL std::optional<Error> DirectoryStore::unchangeable() const {
  if (read_only_)
    return Error{Errc::denied, fmt::format("{} serves a read-only cache ({}): nothing in it can change; mount it "
                                           "with neffcachefs --upper DIR to add to it",
                                           view_, lowers_.empty() ? view_ : lowers_.front())};
  if (mounted_ || ::access(view_.c_str(), W_OK) == 0 || (errno != EROFS && errno != EACCES && errno != EPERM))
    return std::nullopt;  // (a folder that does not exist yet is made by what changes it)
  return Error{Errc::denied, fmt::format("{} is read-only ({}): nothing in it can change; mount it with neffcachefs "
                                         "--upper DIR to add to it",
                                         view_, std::strerror(errno))};
}

NEFFCACHE_DECL std::optional<std::string> DirectoryStore::daemon_stats() const {
  if (!mounted_) return std::nullopt;
  auto text = detail::read_file(fmt::format("{}/{}/stats.json", view_, k_private_prefix));
  if (!text) return std::nullopt;
  return std::move(*text);
}

NEFFCACHE_DECL EntryPaths DirectoryStore::paths(const Entry& e) const {
  return {index_.entry_dir(e.path()), fmt::format("{}/{}", view_, e.path())};
}

NEFFCACHE_DECL std::optional<Error> DirectoryStore::in_lower_layer(const Entry& e) const {
  if (lowers_.empty()) return std::nullopt;
  auto k = index_.layers().layer_of(e.path());
  if (!k || *k == 0) return std::nullopt;
  return Error{Errc::denied,
               fmt::format("{}: in the read-only layer {}; remove it through the mount to hide it (rm -r)", view(e),
                           index_.layers().roots()[*k])};
}

NEFFCACHE_DECL Result<std::unique_ptr<Destination>> DirectoryStore::destination(const Entry& e) const {
  return std::unique_ptr<Destination>(std::make_unique<FolderEntry>(fmt::format("{}/{}", backing_, e.path())));
}

NEFFCACHE_DECL std::string DirectoryStore::state_dir() const { return fmt::format("{}/{}", backing_, k_private_prefix); }

}  // namespace neffcache::store
