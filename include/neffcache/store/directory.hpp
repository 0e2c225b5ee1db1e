// A cache in a local directory, plain or a neffcachefs mount. On a mount, entries are
// read and locked in the mount's backing folder (found in the daemon's stats.json):
// through the mount a lookup in a pending entry finds the model.neff that opening it will
// produce, and our files of LNL entries are hidden. Files are removed and written through the mount, so the kernel and the
// daemon see the change at once. On a plain cache both are the same folder.
//
// A mount over layers (neffcachefs --upper/--lower, or a read-only cache: layers.hpp)
// names its read-only layers in stats.json too: entries are listed across the layers
// and read in the layer that holds them, and the content index looks through all of
// them. What changes an entry acts on layer 0; an entry of a read-only layer is refused
// with one line (a removal through the mount hides it instead).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <neffcache/core/decl.hpp>
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
NEFFCACHE_DECL std::optional<MountedCache> mounted_cache(const std::string& root);
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
  static std::unique_ptr<DirectoryStore> open(const std::string& root);
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

  Result<std::vector<EntryInfo>> list(IfMissing if_missing = IfMissing::error) const override;

  // An entry folder or a file in one, as a path or relative to the cache, in the view or
  // the backing folder: a MODULE_* folder, or an LNL entry's (its key, in the cache's root).
  Result<Entry> named(std::string_view arg) const override;

  std::string view(const Entry& e) const override;

  Result<EntryFiles> files(const Entry& e) const override { return read_entry_files(paths(e).backing); }

  Result<LocalFile> local_file(const Entry& e, std::string_view name) const override;

  Result<bool> put_graph(const Entry& e, std::string_view hlo_bytes,
                         const std::vector<std::string>& flags) const override;

  // A failure is forgotten for every twin that holds it (the content index's failures of
  // the same identity), so that none of them is given it again.
  Result<bool> clear_failure(const Entry& e) const override;
  // The index forgets what an entry no longer holds.
  Result<void> clear_results(const Entry& e) const override;
  Result<void> remove(const Entry& e) const override;

  Result<std::string> clear_stale_lock(const EntryInfo& e) const override;

  NeffVerdict verify(const EntryInfo& e) const override { return verify_neff(paths(entry(e)).backing, e.files); }

  void remove_empty_compiler_dirs(const std::set<std::string>& compiler_dirs) const override;

  // An entry folder in the view or the backing folder.
  Result<Entry> of_folder(const std::string& dir) const override;

  CompileFunction compile_function() const override { return {}; }
  // Kept in the backing folder, where a mount's clients never see it.
  const ContentIndex* content_index() const override { return &index_; }
  Result<IndexUpdate> update_index(bool rebuild, const std::vector<std::string>& default_flags) const override;
  Result<void> record_result(const Entry& e, const ContentId& id, double compile_seconds) const override {
    if (auto r = index_.add(id, e.path(), compile_seconds); !r) return r.error();
    return {};
  }
  std::optional<IndexRecord> find_twin(const ContentId& id, std::string_view except, bool with_failures,
                                       const std::vector<std::string>&) const override {
    auto twin = index_.find(id, except, with_failures);
    if (!twin) return std::nullopt;
    return std::move(twin->record);
  }
  ReuseFunction reuse_function() const override {
    return [lowers = lowers_](const std::string& entry, const std::string& key, const CompileSettings& s) {
      return folder_reuse(entry, key, s, lowers);
    };
  }
  std::string peaks_dir() const override;
  RecordFunction record_function() const override {
    return [lowers = lowers_](const std::string& entry, const std::string& key, const CompileResult& r,
                              const CompileSettings& s) { folder_record(entry, key, r, s, lowers); };
  }
  bool compiles_on_open() const override { return mounted_; }
  // In the backing folder (layer 0), under the entry's lock.
  Result<std::unique_ptr<Destination>> destination(const Entry& e) const override;
  std::optional<std::string> folder() const override { return view_; }
  std::string state_dir() const override;
  std::optional<Error> unchangeable() const override;
  std::optional<std::string> daemon_stats() const override;

 private:
  DirectoryStore(std::string view, std::string backing, bool mounted, std::vector<std::string> lowers)
      : view_(std::move(view)),
        backing_(std::move(backing)),
        mounted_(mounted),
        lowers_(std::move(lowers)),
        index_(backing_, lowers_) {}

  // The entry's folder in the layer that holds it, and where users see it.
  EntryPaths paths(const Entry& e) const;

  // The refusal of a change to an entry that a read-only layer holds; nullopt when layer
  // 0 holds it, or nobody does.
  std::optional<Error> in_lower_layer(const Entry& e) const;

  std::string view_;
  std::string backing_;
  bool mounted_;
  bool read_only_ = false;
  std::vector<std::string> lowers_;
  ContentIndex index_;
};

}  // namespace neffcache::store

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/store/directory.ipp>
#endif
