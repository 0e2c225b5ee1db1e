// A cache in a local directory, plain or a neffcachefs mount. On a mount, entries are
// read and locked in the mount's backing folder (found in the daemon's stats.json):
// through the mount a pending entry already lists the model.neff that opening it will
// produce. Files are removed and written through the mount, so the kernel and the
// daemon see the change at once. On a plain cache both are the same folder.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/store/store.hpp>

namespace neffcache::store {

// The backing folder of a neffcachefs mount at `root` (from the daemon's stats.json);
// nullopt when `root` is no mount.
inline std::optional<std::string> mount_backing(const std::string& root) {
  auto text = detail::read_file(fmt::format("{}/{}/stats.json", root, k_private_prefix));
  if (!text) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("backing") || !j["backing"].is_string()) return std::nullopt;
  return j["backing"].get<std::string>();
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
    auto backing = mount_backing(view);
    return std::unique_ptr<DirectoryStore>(new DirectoryStore(view, backing.value_or(view), backing.has_value()));
  }

  // The folder users see (the mount, or the cache), and where entries are read.
  const std::string& root() const { return view_; }
  const std::string& backing() const { return backing_; }

  std::string name() const override { return view_; }

  Result<std::vector<EntryInfo>> list(IfMissing if_missing = IfMissing::error) const override {
    std::error_code ec;
    if (if_missing == IfMissing::empty && !std::filesystem::exists(view_, ec)) return std::vector<EntryInfo>{};
    return list_entries(backing_);
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
      if (!fs::is_directory(p, ec) || (!folder.starts_with(k_module_dir_prefix) && !is_lnl_key(folder))) continue;
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
    const std::string dir = view(e);
    for (const auto& d : {view_, fmt::format("{}/{}", view_, e.compiler_dir()), dir})
      if (sys::mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return sys_error("create", d);
    return store_graph(dir, hlo_bytes, flags);
  }

  // A failure is forgotten for every twin that holds it (the content index's failures of
  // the same identity), so that none of them is given it again.
  Result<bool> clear_failure(const Entry& e) const override {
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
    auto r = neffcache::clear_results(paths(e));
    if (r) index_.forget(e.path());
    return r;
  }
  Result<void> remove(const Entry& e) const override {
    auto r = neffcache::remove_entry(paths(e));
    if (r) index_.forget(e.path());
    return r;
  }

  Result<std::string> clear_stale_lock(const EntryInfo& e) const override {
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
      if (dir.starts_with(root + "/") && is_entry_path(std::string_view(dir).substr(root.size() + 1)))
        return make_entry(dir.substr(root.size() + 1));
    return Error{Errc::invalid_argument, fmt::format("{}: not an entry of the cache {}", dir, view_)};
  }

  CompileFunction compile_function() const override { return {}; }
  // Kept in the backing folder, where a mount's clients never see it.
  const ContentIndex* content_index() const override { return &index_; }
  ReuseFunction reuse_function() const override { return folder_reuse; }
  std::string peaks_dir() const override { return fmt::format("{}/{}", backing_, k_peaks_dir); }
  RecordFunction record_function() const override { return folder_record; }
  bool compiles_on_open() const override { return mounted_; }
  std::optional<std::string> daemon_stats() const override {
    if (!mounted_) return std::nullopt;
    auto text = detail::read_file(fmt::format("{}/{}/stats.json", view_, k_private_prefix));
    if (!text) return std::nullopt;
    return std::move(*text);
  }

 private:
  DirectoryStore(std::string view, std::string backing, bool mounted)
      : view_(std::move(view)), backing_(std::move(backing)), mounted_(mounted), index_(backing_) {}

  EntryPaths paths(const Entry& e) const {
    return {fmt::format("{}/{}", backing_, e.path()), fmt::format("{}/{}", view_, e.path())};
  }

  std::string view_;
  std::string backing_;
  bool mounted_;
  ContentIndex index_;
};

}  // namespace neffcache::store
