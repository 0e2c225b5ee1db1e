// A cache in an S3 bucket (s3/cache.hpp): entries are the objects under
// <prefix>/neuronxcc-*/MODULE_*/, named by users by their URL. Changes are made under
// the entry's lease; compiles run here in a staging folder under the lease.
#pragma once

#include <memory>
#include <string>

#include <fmt/format.h>

#include <neffcache/core/detail/digest.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/store/store.hpp>
#include <neffcache/cache/url.hpp>

namespace neffcache::store {

class S3Store final : public Store {
 public:
  // A client for the bucket of `url` (an s3:// URL); no request is made yet.
  static Result<std::unique_ptr<S3Store>> open(const CacheUrl& url, const EnvLookup& env = process_env) {
    if (!url.is_s3()) return Error{Errc::invalid_argument, fmt::format("{}: not an s3:// cache", url.text)};
    auto s3 = S3Client::open(url, env);
    if (!s3) return s3.error();
    return std::unique_ptr<S3Store>(new S3Store(url, std::move(*s3)));
  }

  const CacheUrl& url() const { return url_; }
  S3Client& client() const { return *s3_; }
  // Options of the compiles run here (the lease's time to live, our name in it).
  void set_compile_options(S3CompileOptions o) { compile_options_ = std::move(o); }

  std::string name() const override { return url_.text; }

  // Every entry, from one listing; an empty prefix lists none whatever `if_missing` says.
  Result<std::vector<EntryInfo>> list(IfMissing = IfMissing::error) const override {
    return list_s3_entries(*s3_, url_.prefix);
  }

  // The entry's path in the cache, or its URL; a trailing '/' is fine.
  Result<Entry> named(std::string_view given) const override {
    std::string arg(given);
    while (!arg.empty() && arg.back() == '/') arg.pop_back();
    if (const std::string root = url_root(); arg.starts_with(root)) arg.erase(0, root.size());
    if (!is_entry_path(arg))
      return Error{Errc::invalid_argument,
                   fmt::format("{}: not an entry of {} (give neuronxcc-*/MODULE_*, or an LNL key)", arg, url_.text)};
    return make_entry(std::move(arg));
  }

  // A file of the entry, by its URL or path in the cache, or the entry itself.
  Result<Entry> named_by_file(std::string_view given) const override {
    std::string path(given);
    while (!path.empty() && path.back() == '/') path.pop_back();
    if (auto slash = path.rfind('/'); slash != std::string::npos) {
      std::string_view last = std::string_view(path).substr(slash + 1);
      if (!is_entry_folder(last)) path.erase(slash);
    }
    return named(path);
  }

  std::string view(const Entry& e) const override { return url_root() + e.path(); }

  Result<EntryFiles> files(const Entry& e) const override {
    auto names = detail::s3_entry_names(*s3_, key(e));
    if (!names) return names.error();
    return detail::files_named(e.path(), *names);
  }

  // A copy downloaded into $TMPDIR, removed when the LocalFile goes.
  Result<LocalFile> local_file(const Entry& e, std::string_view name) const override {
    std::string copy = fmt::format("{}/neffcache-{}", detail::getenv_or("TMPDIR", "/tmp"), detail::random_hex64());
    auto got = s3_->download(fmt::format("{}/{}", key(e), name), copy);
    if (!got) return got.error();
    return LocalFile(std::move(copy), LocalFile::Kind::temporary_copy);
  }

  Result<bool> put_graph(const Entry& e, std::string_view hlo_bytes,
                         const std::vector<std::string>& flags) const override {
    return store_s3_graph(*s3_, url_.prefix, e.path(), hlo_bytes, flags);
  }

  Result<bool> clear_failure(const Entry& e) const override { return clear_s3_failure(*s3_, url_.prefix, e.path()); }
  Result<void> clear_results(const Entry& e) const override { return clear_s3_results(*s3_, url_.prefix, e.path()); }
  Result<void> remove(const Entry& e) const override { return remove_s3_entry(*s3_, url_.prefix, e.path()); }

  Result<std::string> clear_stale_lock(const EntryInfo& e) const override {
    auto lease = clear_s3_stale_lock(*s3_, url_.prefix, e.path, e.files);
    if (!lease) return lease.error();
    if (!lease->record) return std::string("a lock object of another tool, past the default ttl");
    if (lease->record->released) return std::string("released by its holder");
    return fmt::format("{} (pid {}) did not renew it for {} s", lease->record->host, lease->record->pid,
                       lease->age.count());
  }

  // S3 keeps no publication record: a done entry's NEFF must exist and not be empty, and
  // an LNL NEFF must have the size its marker records, when it records one.
  NeffVerdict verify(const EntryInfo& e) const override {
    if (!e.files.has(EntryFile::neff))
      return {NeffCheck::broken, fmt::format("{} without {}", e.files.done_name(), e.files.neff_name())};
    if (e.neff_bytes == 0) return {NeffCheck::broken, fmt::format("{} is empty", e.files.neff_name())};
    if (e.files.is_lnl())
      if (auto marker = s3_->get(fmt::format("{}/{}", s3_key(url_.prefix, e.path), k_lnl_marker_file)))
        if (auto size = lnl_marker_neff_size(*marker); size && *size != e.neff_bytes)
          return {NeffCheck::broken, fmt::format("{} has {} bytes, its marker says {}", e.files.neff_name(),
                                                 e.neff_bytes, *size)};
    return {NeffCheck::unrecorded, ""};
  }

  // Keys have no folders to remove.
  void remove_empty_compiler_dirs(const std::set<std::string>&) const override {}

  // Jobs are the entries' URLs; each compiles under its lease (compile_s3_entry).
  // Jobs are URLs: the compile finds out under the entry's lease whether it is settled.
  SettledFunction settled_function() const override { return {}; }
  CompileFunction compile_function() const override {
    return [this](const std::string& job, const CompileSettings& s) {
      auto e = named(job);
      if (!e) return CompileResult::of(CompileOutcome::transient, e.error().message);
      return compile_s3_entry(*s3_, url_.prefix, e->path(), s, compile_options_);
    };
  }
  bool copies_equal_graphs() const override { return false; }

 private:
  S3Store(CacheUrl url, std::unique_ptr<S3Client> s3) : url_(std::move(url)), s3_(std::move(s3)) {}

  // s3://bucket/prefix/, which an entry's path follows in its URL.
  std::string url_root() const { return fmt::format("s3://{}/{}", url_.bucket, s3_key(url_.prefix, "")); }
  std::string key(const Entry& e) const { return s3_key(url_.prefix, e.path()); }

  CacheUrl url_;
  std::unique_ptr<S3Client> s3_;
  S3CompileOptions compile_options_;
};

}  // namespace neffcache::store
