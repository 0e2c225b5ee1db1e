// The content index of an S3 cache (what cache/index.hpp is for a folder): which entries
// of the bucket hold a result of which content identity, so that a graph compiled on one
// host under one name is served on every host under any other name, without a compile.
//
// Objects, under the cache's prefix (no entry path looks like them, so listings of
// entries never see them):
//   .neffcache/index/by-id/neuronxcc-<v>/<sha256>+<flags hash>/MODULE_<...>   a record
//   .neffcache/index/by-entry/neuronxcc-<v>/MODULE_<...>                      its identity
// A record is the JSON a folder's index writes (IndexRecord), with the NEFF object's
// ETag. Every publisher of a result writes them (compile_s3_entry, so `neffcache
// compile`, neuron_parallel_compile and a daemon's tier; `neffcache index` for entries
// that others published), each object whole in one PUT; writes are best effort.
//
// A record is a hint and never trusted. Anyone who can write to the bucket can write a
// record, so before a twin is served its entry must hold the recorded result (a NEFF
// with the recorded size and ETag, and its done marker; or a recorded failure) and its
// own inputs (HLO and flags, downloaded) must give the very identity asked for: the
// compiler folder in its path, the canonical graph and the flags. A record that names
// another graph is dropped and never served. The NEFF is then copied on the server,
// only while it still has the ETag checked (S3Client::copy).
//
// An LNL entry's identity names the compiler version that made its result (it has no
// compiler folder), which our publication record says: a compile that publishes an LNL
// entry to a bucket puts that record beside its NEFF as <key>/.neffcache-meta.json
// (compiler_version, and the NEFF's size, which a check compares). An LNL entry without
// one (promoted from a folder we did not compile, pushed, or failed) has no identity in a
// bucket, as in a folder without our record.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/index.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/client.hpp>

namespace neffcache {

class S3Index {
 public:
  // The index of the S3 cache at `prefix`. `default_flags`: the flags of an entry without
  // compile_flags.json (as NEURON_CC_FLAGS gives them), for the identities it computes.
  // `scratch`: where inputs are downloaded for a check (default: $TMPDIR).
  S3Index(S3Client& s3, std::string prefix, std::vector<std::string> default_flags = {}, std::string scratch = {})
      : s3_(s3), prefix_(std::move(prefix)), default_flags_(std::move(default_flags)), scratch_(std::move(scratch)) {}

  // Whether an entry can have an identity in a bucket: of either dialect.
  static bool indexes(std::string_view entry) { return is_entry_path(entry); }
  // Whether `entry` can hold a result of `id` by its path: a Neuron entry in the identity's
  // compiler folder, or an LNL entry (whose version its record says: entry_id reads it).
  static bool can_hold(std::string_view entry, const ContentId& id) {
    return indexes(entry) && (is_lnl_key(entry) || compiler_dir_of(entry) == id.compiler_dir);
  }

  // The identity of the S3 entry `entry` from its inputs, downloaded into a scratch
  // folder (`files`: its files on S3), and for an LNL entry its record's compiler version.
  // Errors: no HLO, an unreadable one, bad flags, an LNL entry with no record of its NEFF
  // (Errc::not_found), S3.
  Result<ContentId> entry_id(const std::string& entry, const EntryFiles& files) const;

  // Records that `entry` holds a result of `id` as S3 has it now: its NEFF (size and ETag
  // read now; `xxh3`: its checksum, from the local copy it was uploaded from) or its
  // recorded failure (`failed`). `compile_seconds`: what it took to compile.
  Result<IndexRecord> add(const ContentId& id, const std::string& entry, bool failed, std::string xxh3,
                          double compile_seconds) const;

  // The records of `id`, as written (unchecked; unreadable ones left out).
  std::vector<IndexRecord> records(const ContentId& id) const;

  // Checks a record of `id` (see the top). Errors say why it fails: Errc::invalid_argument
  // when the record says what is not so; Errc::precondition_failed when this host cannot
  // tell (an entry keyed with default flags other than `default_flags`); others are S3's.
  Result<IndexRecord> check(const ContentId& id, const IndexRecord& r) const;

  // A twin of `id` other than the entry `except`: the first record that passes check
  // (failures only when `with_failures`). With `drop`, records that say what is not so
  // are removed, each reported once through `log`.
  std::optional<IndexRecord> find(const ContentId& id, std::string_view except, bool with_failures,
                                  const std::function<void(std::string_view)>& log = {}, bool drop = true) const;

  // The identity recorded for `entry`, if any.
  std::optional<ContentId> id_of(const std::string& entry) const;

  // Every entry the index has an identity for (the by-entry objects), no order.
  Result<std::vector<std::string>> entries() const;

  // Removes the record of `entry` under `id`, and its identity if it is that one.
  void forget(const ContentId& id, const std::string& entry) const;
  // Removes whatever is recorded for `entry`.
  void forget(const std::string& entry) const {
    if (auto id = id_of(entry)) forget(*id, entry);
    (void)s3_.remove(entry_key(entry));
  }

  std::string record_key(const ContentId& id, const std::string& entry) const;
  std::string entry_key(const std::string& entry) const;

 private:
  std::string id_prefix(const ContentId& id) const;
  // The compiler version of the LNL entry `entry`: its record's, if the record
  // describes the NEFF it holds.
  Result<std::string> lnl_compiler_version(const std::string& entry, const EntryFiles& files) const;

  S3Client& s3_;
  std::string prefix_;
  std::vector<std::string> default_flags_;
  std::string scratch_;
};

namespace detail {

// Gives the S3 entry at `base` (its objects: `files`) the result of `twin`, a checked
// record of `id` whose entry is at `twin_base`: its NEFF copied on the server, only while
// it is the version checked, its record (an LNL entry's names the compiler version of
// `id`), then the done marker; or its failure log copied as ours.
NEFFCACHE_DECL Result<void> serve_s3_twin(S3Client& s3, const std::string& base, const EntryFiles& files,
                                          const std::string& twin_base, const ContentId& id, const IndexRecord& twin);

}  // namespace detail

// The content index's part in the compiles of the S3 cache at `prefix`
// (S3CompileOptions reuse and record), unless a compile's settings turn the index off
// (CompileSettings::content_index). `s3` must outlive them.
NEFFCACHE_DECL S3CompileOptions::Reuse s3_index_reuse(S3Client& s3, std::string prefix);
NEFFCACHE_DECL S3CompileOptions::Record s3_index_record(S3Client& s3, std::string prefix);

// What scan_s3_index did.
struct S3IndexScan {
  std::size_t entries = 0;     // done and failed entries seen
  std::size_t added = 0;       // recorded now
  std::size_t unreadable = 0;  // without a readable HLO, flags or LNL record: no identity
  std::size_t forgotten = 0;   // records of entries that are gone or hold no result
};

// Records the done and failed entries of `listing` (the cache's, list_s3_entries) that
// the index does not know yet (published by other tools or hosts, or before the index
// existed), and forgets the records of entries that no longer hold a result (`gc`
// removed them, or a retry cleared them). With `rebuild`, every entry is recorded anew.
NEFFCACHE_DECL S3IndexScan scan_s3_index(const S3Index& index, const std::vector<EntryInfo>& listing,
                                         bool rebuild = false);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/index.ipp>
#endif
