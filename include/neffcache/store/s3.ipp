// Definitions of store/s3.hpp (core/decl.hpp).
#pragma once

#include <neffcache/store/s3.hpp>

#include <fmt/format.h>

namespace neffcache::store {

NEFFCACHE_DECL Result<std::unique_ptr<S3Store>> S3Store::open(const CacheUrl& url, const EnvLookup& env) {
  if (!url.is_s3()) return Error{Errc::invalid_argument, fmt::format("{}: not an s3:// cache", url.text)};
  auto s3 = S3Client::open(url, env);
  if (!s3) return s3.error();
  return std::unique_ptr<S3Store>(new S3Store(url, std::move(*s3)));
}

NEFFCACHE_DECL Result<Entry> S3Store::named(std::string_view given) const {
  std::string arg(given);
  while (!arg.empty() && arg.back() == '/') arg.pop_back();
  if (const std::string root = url_root(); arg.starts_with(root)) arg.erase(0, root.size());
  if (!is_entry_path(arg))
    return Error{Errc::invalid_argument,
                 fmt::format("{}: not an entry of {} (give neuronxcc-*/MODULE_*, or an LNL key)", arg, url_.text)};
  return make_entry(std::move(arg));
}

NEFFCACHE_DECL Result<Entry> S3Store::named_by_file(std::string_view given) const {
  std::string path(given);
  while (!path.empty() && path.back() == '/') path.pop_back();
  if (auto slash = path.rfind('/'); slash != std::string::npos) {
    std::string_view last = std::string_view(path).substr(slash + 1);
    if (!is_entry_folder(last)) path.erase(slash);
  }
  return named(path);
}

NEFFCACHE_DECL Result<LocalFile> S3Store::local_file(const Entry& e, std::string_view name) const {
  std::string copy = fmt::format("{}/neffcache-{}", detail::getenv_or("TMPDIR", "/tmp"), detail::random_hex64());
  auto got = s3_->download(fmt::format("{}/{}", key(e), name), copy);
  if (!got) return got.error();
  return LocalFile(std::move(copy), LocalFile::Kind::temporary_copy);
}

NEFFCACHE_DECL Result<void> S3Store::copy_file(const Entry& e, std::string_view name, const std::string& to) const {
  if (auto got = s3_->download(fmt::format("{}/{}", key(e), name), to); !got) return got.error();
  return {};
}

NEFFCACHE_DECL Result<std::string> S3Store::clear_stale_lock(const EntryInfo& e) const {
  auto lease = clear_s3_stale_lock(*s3_, url_.prefix, e.path, e.files);
  if (!lease) return lease.error();
  if (!lease->record) return std::string("a lock object of another tool, past the default ttl");
  if (lease->record->released) return std::string("released by its holder");
  return fmt::format("{} (pid {}) did not renew it for {} s", lease->record->host, lease->record->pid,
                     lease->age.count());
}

NEFFCACHE_DECL NeffVerdict S3Store::verify(const EntryInfo& e) const {
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

NEFFCACHE_DECL Result<bool> S3Store::clear_failure(const Entry& e) const {
  auto cleared = clear_s3_failure(*s3_, url_.prefix, e.path());
  if (!cleared) return cleared;
  if (auto id = index_.id_of(e.path())) {
    for (const auto& r : index_.records(*id)) {
      if (!r.failed) continue;
      // (Only an entry that says it is of this identity: records are not trusted.)
      if (r.entry != e.path() && (index_.id_of(r.entry) != id || !clear_s3_failure(*s3_, url_.prefix, r.entry)))
        continue;  // busy, or not a twin: its record stays
      index_.forget(*id, r.entry);
    }
  }
  return cleared;
}

NEFFCACHE_DECL Result<IndexUpdate> S3Store::update_index(bool rebuild,
                                                         const std::vector<std::string>& default_flags) const {
  auto listing = list();
  if (!listing) return listing.error();
  auto scan = scan_s3_index(S3Index(*s3_, url_.prefix, default_flags), *listing, rebuild);
  return IndexUpdate{scan.entries, scan.added, scan.unreadable, scan.forgotten};
}

NEFFCACHE_DECL CompileFunction S3Store::compile_function() const {
  return [this](const std::string& job, const CompileSettings& s) {
    auto e = named(job);
    if (!e) return CompileResult::of(CompileOutcome::transient, e.error().message);
    return compile_s3_entry(*s3_, url_.prefix, e->path(), s, compile_options_);
  };
}

NEFFCACHE_DECL std::string S3Store::url_root() const {
  return fmt::format("s3://{}/{}", url_.bucket, s3_key(url_.prefix, ""));
}

}  // namespace neffcache::store
