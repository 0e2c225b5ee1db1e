// A cache in an S3 bucket (s3/cache.hpp): entries are the objects under
// <prefix>/neuronxcc-*/MODULE_*/, named by users by their URL. Changes are made under
// the entry's lease; compiles run here in a staging folder under the lease.
#pragma once

#include <memory>
#include <string>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/digest.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/index.hpp>
#include <neffcache/store/store.hpp>
#include <neffcache/cache/url.hpp>

namespace neffcache::store {

class S3Store final : public Store {
 public:
  // A client for the bucket of `url` (an s3:// URL); no request is made yet.
  static Result<std::unique_ptr<S3Store>> open(const CacheUrl& url, const EnvLookup& env = process_env);

  const CacheUrl& url() const { return url_; }
  S3Client& client() const { return *s3_; }
  // Options of the compiles run here (the lease's time to live, our name in it); the
  // bucket's content index takes part in them unless `o` says otherwise.
  void set_compile_options(S3CompileOptions o) {
    if (!o.reuse) o.reuse = s3_index_reuse(*s3_, url_.prefix);
    if (!o.record) o.record = s3_index_record(*s3_, url_.prefix);
    compile_options_ = std::move(o);
  }

  std::string name() const override { return url_.text; }

  // Every entry, from one listing; an empty prefix lists none whatever `if_missing` says.
  Result<std::vector<EntryInfo>> list(IfMissing = IfMissing::error) const override {
    return list_s3_entries(*s3_, url_.prefix);
  }

  // The entry's path in the cache, or its URL; a trailing '/' is fine.
  Result<Entry> named(std::string_view given) const override;

  // A file of the entry, by its URL or path in the cache, or the entry itself.
  Result<Entry> named_by_file(std::string_view given) const override;

  std::string view(const Entry& e) const override { return url_root() + e.path(); }

  Result<EntryFiles> files(const Entry& e) const override {
    auto names = detail::s3_entry_names(*s3_, key(e));
    if (!names) return names.error();
    return detail::files_named(e.path(), *names);
  }

  // A copy downloaded into $TMPDIR, removed when the LocalFile goes.
  Result<LocalFile> local_file(const Entry& e, std::string_view name) const override;
  // Downloaded straight to `to`.
  Result<void> copy_file(const Entry& e, std::string_view name, const std::string& to) const override;
  // Under the entry's lease, with this store's compile options (ttl, host).
  Result<std::unique_ptr<Destination>> destination(const Entry& e) const override {
    return std::unique_ptr<Destination>(
        std::make_unique<S3Entry>(*s3_, url_.prefix, e.path(), compile_options_.lease_ttl, compile_options_.host));
  }

  Result<bool> put_graph(const Entry& e, std::string_view hlo_bytes,
                         const std::vector<std::string>& flags) const override {
    return store_s3_graph(*s3_, url_.prefix, e.path(), hlo_bytes, flags);
  }

  // The bucket's content index forgets what an entry no longer holds (s3/index.hpp); a
  // failure cleared is cleared for its twins too, as in a directory cache.
  Result<bool> clear_failure(const Entry& e) const override;
  Result<void> clear_results(const Entry& e) const override {
    auto r = clear_s3_results(*s3_, url_.prefix, e.path());
    if (r) index_.forget(e.path());
    return r;
  }
  Result<void> remove(const Entry& e) const override {
    auto r = remove_s3_entry(*s3_, url_.prefix, e.path());
    if (r) index_.forget(e.path());
    return r;
  }
  Result<IndexUpdate> update_index(bool rebuild, const std::vector<std::string>& default_flags) const override;
  Result<void> record_result(const Entry& e, const ContentId& id, double compile_seconds) const override {
    if (auto r = index_.add(id, e.path(), false, {}, compile_seconds); !r) return r.error();
    return {};
  }
  std::optional<IndexRecord> find_twin(const ContentId& id, std::string_view except, bool with_failures,
                                       const std::vector<std::string>& default_flags) const override {
    // (Read-only: a command that only looks, such as explain, removes nothing.)
    return S3Index(*s3_, url_.prefix, default_flags).find(id, except, with_failures, {}, /*drop=*/false);
  }

  Result<std::string> clear_stale_lock(const EntryInfo& e) const override;

  // S3 keeps no publication record: a done entry's NEFF must exist and not be empty, and
  // an LNL NEFF must have the size its marker records, when it records one.
  NeffVerdict verify(const EntryInfo& e) const override;

  // Keys have no folders to remove.
  void remove_empty_compiler_dirs(const std::set<std::string>&) const override {}

  // Jobs are the entries' URLs; each compiles under its lease (compile_s3_entry).
  // Jobs are URLs: the compile finds out under the entry's lease whether it is settled.
  SettledFunction settled_function() const override { return {}; }
  CompileFunction compile_function() const override;
  bool copies_equal_graphs() const override { return false; }

 private:
  S3Store(CacheUrl url, std::unique_ptr<S3Client> s3)
      : url_(std::move(url)), s3_(std::move(s3)), index_(*s3_, url_.prefix) {
    set_compile_options({});
  }

  // s3://bucket/prefix/, which an entry's path follows in its URL.
  std::string url_root() const;
  std::string key(const Entry& e) const { return s3_key(url_.prefix, e.path()); }

  CacheUrl url_;
  std::unique_ptr<S3Client> s3_;
  S3CompileOptions compile_options_;
  S3Index index_;  // (records are forgotten through it; flags do not matter there)
};

}  // namespace neffcache::store

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/store/s3.ipp>
#endif
