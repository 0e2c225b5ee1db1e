// A cache in an S3 bucket, laid out as the directory cache is: the objects of an entry
// are <prefix>/neuronxcc-<version>/MODULE_<graph>+<flags>/<file>, or of an LNL entry
// <prefix>/<key>/<file> (its lease is our .neffcache-lease in it). This header reads
// entries and their states from listings and compiles an entry under its lease, in the
// steps of every compile (compile/pipeline.hpp) with an S3Entry for destination:
//
//   1. the entry's listing says done or failed: nothing to do;
//   2. take the lease (lease.hpp); held elsewhere: busy;
//   3. look again under the lease: whoever held it may have finished;
//   4. download the HLO and flags into a local staging entry, compile it there with
//      compile_entry (timeouts, retries, failure records as for a directory), the lease
//      renewed from the moment it was taken; a lost lease stops the compile;
//   5. renew once more (still ours?), upload model.neff, then model.done with
//      If-None-Match: * (so a reader never sees done without the NEFF), or upload the
//      failure's model.log;
//   6. release the lease; once the entry is done the lock object is deleted (whoever
//      takes a lease of a done entry finds it done in step 3).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json_fwd.hpp>

#include <neffcache/compile/compile.hpp>
#include <neffcache/compile/hold.hpp>
#include <neffcache/compile/pipeline.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/lease.hpp>
#include <neffcache/s3/nki.hpp>

namespace neffcache {

// The objects of one entry, by file name.
using S3EntryObjects = std::map<std::string, ObjectInfo, std::less<>>;

// Groups keys under `prefix` into entries: "neuronxcc-X/MODULE_Y" -> its objects. Keys
// outside the layout are ignored.
NEFFCACHE_DECL std::map<std::string, S3EntryObjects> group_s3_entries(const std::vector<ObjectInfo>& objects,
                                                                       const std::string& prefix);

// The files of the entry at `rel` (either dialect) from its objects.
inline EntryFiles s3_entry_files(std::string_view rel, const S3EntryObjects& objects) {
  EntryFiles f = EntryFiles::of_entry_path(rel);
  for (const auto& [name, o] : objects) f.note(name);
  return f;
}

// The state of an entry from its objects. A lock object is read as a lease: released,
// it counts as no lock (a released lease stays until the entry is done); expired, as a
// stale lock (its holder died or was cut off); else the entry is compiling. A lease that
// cannot be read counts as live: nobody should take over what cannot be seen.
NEFFCACHE_DECL EntryState s3_entry_state(S3Client& s3, const std::string& prefix, const std::string& rel,
                                         EntryFiles files);

// Every entry under `prefix`, from one listing (plus one read per lock object).
NEFFCACHE_DECL Result<std::vector<EntryInfo>> list_s3_entries(S3Client& s3, const std::string& prefix);

namespace detail {

// The names of an entry's objects now.
NEFFCACHE_DECL Result<std::vector<std::string>> s3_entry_names(S3Client& s3, const std::string& base);

// The files of the entry at `rel` (either dialect) from the names of its objects.
inline EntryFiles files_named(std::string_view rel, const std::vector<std::string>& names) {
  EntryFiles f = EntryFiles::of_entry_path(rel);
  for (const auto& n : names) f.note(n);
  return f;
}

// The inputs of an entry of `files` to bring with it, in the order they are written (the
// HLO last: an entry with its HLO is taken as whole): its flags (LNL: command.txt and
// LNL's metadata), then its HLO. Only those `files` has.
NEFFCACHE_DECL std::vector<std::string> input_names(const EntryFiles& files);

// Downloads the inputs (input_names) of the S3 entry `rel` of the cache at `prefix`, whose
// files are `files`, into a new folder under `root`, as <folder>/<rel>: the entry keeps its
// path, so its compiler folder and file names are those of a directory cache. Returns the
// new folder (the caller removes it, also after an error: it is set as soon as it exists)
// through `made`, and the staged entry's folder.
NEFFCACHE_DECL Result<std::string> stage_s3_inputs(S3Client& s3, const std::string& prefix, const std::string& rel,
                                                   const EntryFiles& files, const std::string& root,
                                                   std::string& made);

// The record an LNL entry's compile puts into the bucket beside its NEFF, as
// <key>/.neffcache-meta.json (k_meta_file), for its identity (s3/index.hpp): the compiler
// version our publication record names, and the NEFF object's size and ETag.
NEFFCACHE_DECL nlohmann::ordered_json s3_lnl_record(std::string_view compiler_version, uint64_t neff_bytes,
                                                    std::string_view etag);

// Uploads a compile's result to the entry at `base` whose objects are `files`, under the
// entry's lease only: the NEFF at `neff` (LNL: with the compiler's log, which LNL keeps
// beside it, when there is one, and s3_lnl_record when our record names a version), then
// the done marker, created only if absent (LNL's marker says how large the NEFF is), and
// drops a failure recorded before. Every compile that publishes to S3 goes through here
// (sync copies whole entries its own way).
NEFFCACHE_DECL Result<void> upload_s3_result(S3Client& s3, const std::string& base, const EntryFiles& files,
                                             const std::string& neff);

// The end of every publication of a result to the entry at `base` whose objects were
// `files`, once its NEFF is there: the done marker, created only if absent (LNL's is
// `lnl_marker`, which says how large the NEFF is), then a failure recorded before dropped.
NEFFCACHE_DECL Result<void> mark_s3_done(S3Client& s3, const std::string& base, const EntryFiles& files,
                                         std::string_view lnl_marker);

}  // namespace detail

// An S3 entry's lease as a hold (compile/hold.hpp): renewed by beat(), lost when a
// renewal finds it taken over or removed.
class LeaseHold final : public EntryHold {
 public:
  explicit LeaseHold(S3Lease lease) : lease_(std::move(lease)) {}
  std::string describe() const override { return lease_.key(); }
  std::chrono::milliseconds beat_every() const override { return lease_.renew_interval(); }
  void finish(bool settled) override { lease_.finish(settled ? S3Lease::Entry::settled : S3Lease::Entry::open); }
  // The lease itself, for a holder that gives it back its own way (no KeepAlive may be
  // beating this hold any more; it holds nothing after).
  S3Lease take() { return std::move(lease_); }

 private:
  Result<void> refresh() override { return lease_.renew(); }
  bool gone(const Error& e) const override { return e.code == Errc::precondition_failed; }

  S3Lease lease_;
};

// The S3 entry `rel` of the cache at `prefix` as a compile's destination
// (compile/pipeline.hpp): held by its lease (`ttl`, `host` as S3Lease::acquire's), its
// result published by upload_s3_result, a failure by uploading its log.
class S3Entry final : public Destination {
 public:
  S3Entry(S3Client& s3, const std::string& prefix, std::string rel, std::chrono::seconds ttl = k_default_lease_ttl,
          std::string host = {})
      : s3_(s3), rel_(std::move(rel)), base_(s3_key(prefix, rel_)), ttl_(ttl), host_(std::move(host)) {}
  std::string describe() const override { return s3_.describe(base_); }
  NEFFCACHE_DECL Result<EntryFiles> files() const override;
  NEFFCACHE_DECL Result<std::unique_ptr<EntryHold>> take(const EntryFiles& files) override;
  std::chrono::milliseconds poll_interval() const override { return std::chrono::seconds(1); }
  NEFFCACHE_DECL Result<std::string> publish(const EntryFiles& files, const Produced& p) override;
  NEFFCACHE_DECL Result<void> record_failure(const EntryFiles& files, const std::string& log) override;

 private:
  S3Client& s3_;
  std::string rel_;
  std::string base_;
  std::chrono::seconds ttl_;
  std::string host_;
};

struct S3CompileOptions {
  // The content index's part (s3/index.hpp, s3_index_reuse and s3_index_record), each
  // given the entry's path, its inputs staged in a local entry folder and its files on S3:
  // under the lease, before a compile, a twin's result served into the entry instead
  // (nullopt: compile it); once a compile's result is on S3 (its NEFF, or its recorded
  // failure), still under the lease, the result recorded. Empty: no index.
  using Reuse = std::function<std::optional<CompileResult>(const std::string& rel, const std::string& staged_entry_dir,
                                                           const EntryFiles& files, const CompileSettings& s)>;
  using Record = std::function<void(const std::string& rel, const std::string& staged_entry_dir,
                                    const CompileResult& r, const CompileSettings& s)>;
  Reuse reuse = {};
  Record record = {};
  std::chrono::seconds lease_ttl = k_default_lease_ttl;
  std::string host = {};  // names us in the lease (default: this machine's name)
  // Called with the staging entry once its NEFF and model.done are on S3, before the
  // staging folder is removed: a caller with a local copy of the cache takes the NEFF.
  std::function<void(const std::string& staged_entry_dir)> published = {};
  // The NKI kernel folder: kernels the graph calls that this host lacks are fetched into
  // it from the bucket before the compile (s3/nki.hpp).
  std::string nki_kernels = nki_kernel_dir();
};

// Compiles the entry `rel` of the S3 cache at `prefix` if it needs it (see the top of
// this file). Outcomes as compile_entry's; a lease held elsewhere is busy.
NEFFCACHE_DECL CompileResult compile_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel,
                                              const CompileSettings& s, const S3CompileOptions& o = {});

// Puts on S3 the NEFF that someone else compiled into the local entry folder `entry_dir`
// (done there) for the entry `rel`, under its lease `lease` (the caller's), unless S3 has
// the entry done already. True if it went up. The lease is given back either way: its
// object deleted once the entry is done (as after a compile), else released.
NEFFCACHE_DECL Result<bool> publish_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel,
                                             const std::string& entry_dir, S3Lease lease);

// Maintenance of S3 entries, each change made under the entry's lease as on a directory
// (maintenance.hpp): an entry being compiled on any host is left alone (Errc::busy).

// Stores a graph as graph extraction does, in the S3 entry `rel`: compile_flags.json,
// then the HLO, created only if absent. False when the entry already had its HLO.
NEFFCACHE_DECL Result<bool> store_s3_graph(S3Client& s3, const std::string& prefix, const std::string& rel,
                                           std::string_view hlo_bytes, const std::vector<std::string>& flags);

namespace detail {

// Runs change(names) under the entry's lease, with the names of its objects as they are
// once the lease is ours, then deletes the lease: we hold it, so no one else does, and
// the entry is left as it was before anyone locked it.
template <class F>
Result<void> with_s3_lease(S3Client& s3, const std::string& prefix, const std::string& rel, F&& change) {
  const std::string base = s3_key(prefix, rel);
  auto names = s3_entry_names(s3, base);
  if (!names) return names.error();
  EntryFiles files = files_named(rel, *names);
  const std::string lock_key = fmt::format("{}/{}", base, files.s3_lock_name());
  auto lease = S3Lease::acquire(s3, lock_key, k_default_lease_ttl);
  if (!lease) return lease.error();
  // Look again under the lease: the names may have changed before we got it.
  names = s3_entry_names(s3, base);
  Result<void> r = names ? change(*names) : Result<void>(names.error());
  // We hold the lease, so deleting it hands the entry back as it was before any lock.
  lease->finish(S3Lease::Entry::settled);
  return r;
}

NEFFCACHE_DECL Result<void> remove_s3_objects(S3Client& s3, const std::string& base,
                                              const std::vector<std::string>& names);

}  // namespace detail

// Forgets a recorded failure (model.log without model.neff; LNL: our failure record).
// False when there was none.
NEFFCACHE_DECL Result<bool> clear_s3_failure(S3Client& s3, const std::string& prefix, const std::string& rel);

// Removes the results (the done marker first, so the entry stops being done at once,
// then the rest, as detail::result_names lists them): the entry is pending again.
NEFFCACHE_DECL Result<void> clear_s3_results(S3Client& s3, const std::string& prefix, const std::string& rel);

// Removes every object of an entry: results first, then the rest, the lease last.
NEFFCACHE_DECL Result<void> remove_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel);

// Removes an entry's lease when it has expired (its holder died or was cut off) by
// taking it over and deleting it; Errc::busy naming the holder when it is live. A
// released lease is removed too. Returns what the lease was.
NEFFCACHE_DECL Result<LeaseInfo> clear_s3_stale_lock(S3Client& s3, const std::string& prefix, const std::string& rel,
                                                     const EntryFiles& files);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/cache.ipp>
#endif
