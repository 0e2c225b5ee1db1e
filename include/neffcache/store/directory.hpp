// A cache in a local directory, plain or a neffcachefs mount. On a mount, entries are
// read and locked in the mount's backing folder (found in the daemon's stats.json):
// through the mount a pending entry already lists the model.neff that opening it will
// produce. Files are removed and written through the mount, so the kernel and the
// daemon see the change at once. On a plain cache both are the same folder.
//
// A mount over layers (neffcachefs --upper/--lower, or a read-only cache: layers.hpp)
// names its read-only layers in stats.json too: entries are listed across the layers
// and read in the layer that holds them, and the content index looks through all of
// them. What changes an entry acts on layer 0; an entry of a read-only layer is refused
// with one line (a removal through the mount hides it instead).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/store/store.hpp>

namespace neffcache::store {

// What a neffcachefs mount serves: its backing folder (layer 0) and the read-only layers
// under it, from the daemon's stats.json.
struct MountedCache {
  std::string backing;
  std::vector<std::string> lowers;
  bool read_only = false;  // a read-only cache without an upper layer: nothing changes
};
// The cache a neffcachefs mount at `root` serves; nullopt when `root` is no mount.
inline std::optional<MountedCache> mounted_cache(const std::string& root) {
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
// The backing folder of a neffcachefs mount at `root`; nullopt when `root` is no mount.
inline std::optional<std::string> mount_backing(const std::string& root) {
  auto m = mounted_cache(root);
  if (!m) return std::nullopt;
  return m->backing;
}

class DirectoryStore final : public Store {
 public:
  // The cache at `root` as given: made absolute and normal (no trailing '/'); a mount's
  // backing folder is looked up now. The folder need not exist.
  static std::unique_ptr<DirectoryStore> open(const std::string& root) {
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
  // A daemon's store over layers: `backing` (layer 0) and the read-only `lowers` under it.
  static std::unique_ptr<DirectoryStore> open_layers(const std::string& backing, std::vector<std::string> lowers) {
    return std::unique_ptr<DirectoryStore>(new DirectoryStore(backing, backing, false, std::move(lowers)));
  }

  // The folder users see (the mount, or the cache), and where entries are read.
  const std::string& root() const { return view_; }
  const std::string& backing() const { return backing_; }
  // The read-only layers under the backing folder (none but over layers).
  const std::vector<std::string>& lowers() const { return lowers_; }

  std::string name() const override { return view_; }

  Result<std::vector<EntryInfo>> list(IfMissing if_missing = IfMissing::error) const override {
    std::error_code ec;
    if (if_missing == IfMissing::empty && !std::filesystem::exists(view_, ec)) return std::vector<EntryInfo>{};
    return list_entries(index_.layers());
  }

  // An entry folder or a file in one, as a path or relative to the cache, in the view or
  // the backing folder: a MODULE_* folder, or an LNL entry's (its key, in the cache's root).
  Result<Entry> named(std::string_view arg) const override {
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

  std::string view(const Entry& e) const override { return fmt::format("{}/{}", view_, e.path()); }

  Result<EntryFiles> files(const Entry& e) const override { return read_entry_files(paths(e).backing); }

  Result<LocalFile> local_file(const Entry& e, std::string_view name) const override {
    return LocalFile(fmt::format("{}/{}", paths(e).backing, name), LocalFile::Kind::in_place);
  }

  Result<bool> put_graph(const Entry& e, std::string_view hlo_bytes,
                         const std::vector<std::string>& flags) const override {
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

  // A failure is forgotten for every twin that holds it (the content index's failures of
  // the same identity), so that none of them is given it again.
  Result<bool> clear_failure(const Entry& e) const override {
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
  // The index forgets what an entry no longer holds.
  Result<void> clear_results(const Entry& e) const override {
    if (auto lower = in_lower_layer(e)) return *lower;
    auto r = neffcache::clear_results(paths(e));
    if (r) index_.forget(e.path());
    return r;
  }
  Result<void> remove(const Entry& e) const override {
    if (auto lower = in_lower_layer(e)) return *lower;
    auto r = neffcache::remove_entry(paths(e));
    if (r) index_.forget(e.path());
    return r;
  }

  Result<std::string> clear_stale_lock(const EntryInfo& e) const override {
    if (auto lower = in_lower_layer(entry(e))) return *lower;
    auto info = neffcache::clear_stale_lock(paths(entry(e)));
    if (!info) return info.error();
    return info->reason.empty() ? std::string("its owner is gone") : info->reason;
  }

  NeffVerdict verify(const EntryInfo& e) const override { return verify_neff(paths(entry(e)).backing, e.files); }

  void remove_empty_compiler_dirs(const std::set<std::string>& compiler_dirs) const override {
    // (An empty name would be the cache itself, which stays.)
    for (const auto& c : compiler_dirs)
      if (!c.empty()) ::rmdir(fmt::format("{}/{}", view_, c).c_str());
  }

  // An entry folder in the view or the backing folder.
  Result<Entry> of_folder(const std::string& dir) const override {
    for (const auto& root : {view_, backing_})
      if (auto rel = entry_path_in(root, dir)) return make_entry(*rel);
    return Error{Errc::invalid_argument, fmt::format("{}: not an entry of the cache {}", dir, view_)};
  }

  CompileFunction compile_function() const override { return {}; }
  // Kept in the backing folder, where a mount's clients never see it.
  const ContentIndex* content_index() const override { return &index_; }
  ReuseFunction reuse_function() const override {
    return [lowers = lowers_](const std::string& entry, const std::string& key, const CompileSettings& s) {
      return folder_reuse(entry, key, s, lowers);
    };
  }
  std::string peaks_dir() const override { return fmt::format("{}/{}", backing_, k_peaks_dir); }
  RecordFunction record_function() const override {
    return [lowers = lowers_](const std::string& entry, const std::string& key, const CompileResult& r,
                              const CompileSettings& s) { folder_record(entry, key, r, s, lowers); };
  }
  bool compiles_on_open() const override { return mounted_; }
  std::optional<Error> unchangeable() const override {
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
  std::optional<std::string> daemon_stats() const override {
    if (!mounted_) return std::nullopt;
    auto text = detail::read_file(fmt::format("{}/{}/stats.json", view_, k_private_prefix));
    if (!text) return std::nullopt;
    return std::move(*text);
  }

 private:
  DirectoryStore(std::string view, std::string backing, bool mounted, std::vector<std::string> lowers)
      : view_(std::move(view)),
        backing_(std::move(backing)),
        mounted_(mounted),
        lowers_(std::move(lowers)),
        index_(backing_, lowers_) {}

  // The entry's folder in the layer that holds it, and where users see it.
  EntryPaths paths(const Entry& e) const { return {index_.entry_dir(e.path()), fmt::format("{}/{}", view_, e.path())}; }

  // The refusal of a change to an entry that a read-only layer holds; nullopt when layer
  // 0 holds it, or nobody does.
  std::optional<Error> in_lower_layer(const Entry& e) const {
    if (lowers_.empty()) return std::nullopt;
    auto k = index_.layers().layer_of(e.path());
    if (!k || *k == 0) return std::nullopt;
    return Error{Errc::denied,
                 fmt::format("{}: in the read-only layer {}; remove it through the mount to hide it (rm -r)", view(e),
                             index_.layers().roots()[*k])};
  }

  std::string view_;
  std::string backing_;
  bool mounted_;
  bool read_only_ = false;
  std::vector<std::string> lowers_;
  ContentIndex index_;
};

}  // namespace neffcache::store
