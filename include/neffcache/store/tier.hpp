// The local tier of an S3 cache (s3/tier.hpp): the folder a daemon mounts for
// `neffcachefs s3://... --local-cache DIR`, filled from S3 as names are asked for. The
// S3 cache is the truth: listings, maintenance and verification go to S3 (a recorded
// failure cleared here is cleared for every host); entries are seen, and compiled, in
// their local folders, and their NEFFs are fetched into them.
#pragma once

#include <memory>
#include <string>
#include <utility>

#include <neffcache/core/decl.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/s3/tier.hpp>
#include <neffcache/store/s3.hpp>
#include <neffcache/store/remote.hpp>
#include <neffcache/store/store.hpp>

namespace neffcache::store {

class TierStore;

// The tier's remote (store/remote.hpp): the bucket its folder is filled from and publishes
// to (S3Tier), told of the folder's entries through the store that names them.
class TierRemote final : public Remote {
 public:
  TierRemote(const TierStore& store, std::shared_ptr<S3Tier> tier) : store_(store), tier_(std::move(tier)) {}
  NEFFCACHE_DECL bool fill(int dir, std::string_view name) const override;
  NEFFCACHE_DECL void fill_listing(int dir) const override;
  NEFFCACHE_DECL std::vector<std::string> names_elsewhere(int dir) const override;
  NEFFCACHE_DECL bool held_elsewhere(int dir, std::string_view lock_name) const override;
  NEFFCACHE_DECL ClientHold hold_for_client(int dir, std::string_view lock_name) const override;
  NEFFCACHE_DECL ClientHold hold_key_for_client(const std::string& entry_dir) const override;
  void give_back_key(const std::string& entry_dir) const override { tier_->give_back(entry_dir); }
  NEFFCACHE_DECL void neff_opened(int neff) const override;
  // (A read-only bucket takes no inputs: what it lacks is compiled and kept here.)
  bool publishes_writes() const override { return !tier_->read_only(); }
  NEFFCACHE_DECL Result<void> publish_written(const std::string& entry_dir) const override;
  // An LNL entry goes to S3 (S3Tier::promote); a Neuron entry has no such protocol.
  NEFFCACHE_DECL Result<void> promote(const std::string& folder, const std::string& to) const override;
  NEFFCACHE_DECL std::optional<nlohmann::ordered_json> counters() const override;

 private:
  const TierStore& store_;
  std::shared_ptr<S3Tier> tier_;
};

class TierStore final : public Store {
 public:
  // The S3 cache at `url` with its local tier in the folder `o.root` (absolute, made if
  // missing; o.prefix is taken from the URL). Two clients: the tier's, and one for
  // listings and maintenance.
  static Result<std::unique_ptr<TierStore>> open(const CacheUrl& url, S3Tier::Options o,
                                                 const EnvLookup& env = process_env);

  // The local folder, and the S3 cache it is the tier of.
  const std::string& root() const { return root_; }
  const S3Store& bucket() const { return *remote_; }
  // Peaks are kept in the local folder: they are this host's to predict from.
  std::string peaks_dir() const override;

  std::string name() const override { return remote_->name(); }
  Result<std::vector<EntryInfo>> list(IfMissing if_missing = IfMissing::error) const override {
    return remote_->list(if_missing);
  }

  // A local entry folder or a file in one, else what the S3 cache accepts (the entry's
  // path in the cache, or its URL).
  Result<Entry> named(std::string_view arg) const override;
  Result<Entry> named_by_file(std::string_view path) const override;

  std::string view(const Entry& e) const override;
  Result<EntryFiles> files(const Entry& e) const override { return read_entry_files(view(e)); }

  // The local file when it is here, else a copy from S3.
  Result<LocalFile> local_file(const Entry& e, std::string_view name) const override;

  Result<bool> put_graph(const Entry& e, std::string_view hlo_bytes,
                         const std::vector<std::string>& flags) const override {
    return remote_->put_graph(on_s3(e), hlo_bytes, flags);
  }

  Result<bool> clear_failure(const Entry& e) const override { return remote_->clear_failure(on_s3(e)); }
  // On S3, then here: a local NEFF would outlive the results it was a copy of.
  Result<void> clear_results(const Entry& e) const override {
    if (auto r = remote_->clear_results(on_s3(e)); !r) return r;
    return drop_local_results(e);
  }
  Result<void> remove(const Entry& e) const override {
    if (auto r = remote_->remove(on_s3(e)); !r) return r;
    return drop_local_results(e);
  }
  Result<std::string> clear_stale_lock(const EntryInfo& e) const override { return remote_->clear_stale_lock(e); }
  NeffVerdict verify(const EntryInfo& e) const override { return remote_->verify(e); }
  void remove_empty_compiler_dirs(const std::set<std::string>&) const override {}

  // Jobs are local entry folders: each is brought to its state on S3, compiled under its
  // lease first if it needs it (S3Tier::settle).
  CompileFunction compile_function() const override {
    return [tier = tier_](const std::string& job, const CompileSettings& s) { return tier->settle(job, s); };
  }
  bool copies_equal_graphs() const override { return false; }

  Result<Entry> of_folder(const std::string& dir) const override;
  const Remote& remote() const override { return tier_remote_; }
  std::optional<std::string> folder() const override { return root_; }
  std::string state_dir() const override { return root_ + "/" + std::string(k_private_prefix); }

 private:
  TierStore(std::unique_ptr<S3Store> remote, std::shared_ptr<S3Tier> tier, std::string root)
      : remote_(std::move(remote)), tier_(std::move(tier)), root_(std::move(root)), tier_remote_(*this, tier_) {}

  // The same entry in the S3 store.
  Entry on_s3(const Entry& e) const { return *remote_->at(e.path()); }

  // A local entry folder, or a file in one, named by a path.
  Result<Entry> local_entry(std::string_view arg) const;

  Result<void> drop_local_results(const Entry& e) const {
    const EntryFiles files = EntryFiles::of_entry_path(e.path());
    return neffcache::detail::unlink_all(view(e), {std::string(files.done_name()), files.neff_name()});
  }

  std::unique_ptr<S3Store> remote_;
  std::shared_ptr<S3Tier> tier_;
  std::string root_;
  TierRemote tier_remote_;
};

}  // namespace neffcache::store

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/store/tier.ipp>
#endif
