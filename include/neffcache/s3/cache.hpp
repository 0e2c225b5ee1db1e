// A cache in an S3 bucket, laid out as the directory cache is: the objects of an entry
// are <prefix>/neuronxcc-<version>/MODULE_<graph>+<flags>/<file>, or of an LNL entry
// <prefix>/<key>/<file> (its lease is our .neffcache-lease in it). This header reads
// entries and their states from listings and compiles an entry under its lease:
//
//   1. the entry's listing says done or failed: nothing to do;
//   2. take the lease (lease.hpp); held elsewhere: busy;
//   3. look again under the lease: whoever held it may have finished;
//   4. download the HLO and flags into a local staging entry, compile it there with
//      compile_entry (timeouts, retries, failure records as for a directory), renewing
//      the lease as the compile runs; a lost lease stops the compile;
//   5. renew once more (still ours?), upload model.neff, then model.done with
//      If-None-Match: * (so a reader never sees done without the NEFF), or upload the
//      failure's model.log;
//   6. release the lease; once the entry is done the lock object is deleted (whoever
//      takes a lease of a done entry finds it done in step 3).
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <neffcache/compile/compile.hpp>
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
inline std::map<std::string, S3EntryObjects> group_s3_entries(const std::vector<ObjectInfo>& objects,
                                                               const std::string& prefix) {
  std::map<std::string, S3EntryObjects> out;
  std::size_t skip = prefix.empty() ? 0 : prefix.size() + 1;
  for (const auto& o : objects) {
    if (o.key.size() <= skip) continue;
    std::string_view rel = std::string_view(o.key).substr(skip);
    auto file = rel.rfind('/');
    if (file == std::string_view::npos || !is_entry_path(rel.substr(0, file))) continue;
    out[std::string(rel.substr(0, file))].emplace(std::string(rel.substr(file + 1)), o);
  }
  return out;
}

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
inline EntryState s3_entry_state(S3Client& s3, const std::string& prefix, const std::string& rel,
                                 EntryFiles files) {
  constexpr auto lock_bits =
      static_cast<uint16_t>(static_cast<uint16_t>(EntryFile::lock_module) | static_cast<uint16_t>(EntryFile::lock_legacy));
  if (files.has_lock() && !files.done()) {
    auto lease = read_lease(s3, fmt::format("{}/{}", s3_key(prefix, rel), files.s3_lock_name()));
    bool gone = lease ? lease->record && lease->record->released : lease.error().code == Errc::not_found;
    if (!gone) return lease && lease->expired ? EntryState::stale_lock : EntryState::compiling;
    files.bits &= static_cast<uint16_t>(~lock_bits);
  }
  // (Any lock left is live; an LNL entry's lock is asked for whenever it is not done.)
  return classify(files, [&] { return files.has_lock(); });
}

// Every entry under `prefix`, from one listing (plus one read per lock object).
inline Result<std::vector<EntryInfo>> list_s3_entries(S3Client& s3, const std::string& prefix) {
  auto listing = s3.list(prefix.empty() ? "" : prefix + "/");
  if (!listing) return listing.error();
  std::vector<EntryInfo> out;
  for (const auto& [rel, objects] : group_s3_entries(listing->objects, prefix)) {
    EntryInfo info;
    info.path = rel;
    info.files = s3_entry_files(rel, objects);
    info.state = s3_entry_state(s3, prefix, rel, info.files);
    const std::string neff = info.files.neff_name();
    for (const auto& [name, o] : objects) {
      info.bytes += o.size;
      info.last_use = std::max(info.last_use, o.modified);
      if (name == neff) info.neff_bytes = o.size;
    }
    out.push_back(std::move(info));
  }
  return out;
}

namespace detail {

// The names of an entry's objects now.
inline Result<std::vector<std::string>> s3_entry_names(S3Client& s3, const std::string& base) {
  auto l = s3.list(base + "/", "/");
  if (!l) return l.error();
  std::vector<std::string> out;
  for (const auto& o : l->objects) out.push_back(o.key.substr(base.size() + 1));
  return out;
}

// The files of the entry at `rel` (either dialect) from the names of its objects.
inline EntryFiles files_named(std::string_view rel, const std::vector<std::string>& names) {
  EntryFiles f = EntryFiles::of_entry_path(rel);
  for (const auto& n : names) f.note(n);
  return f;
}

// The inputs of an entry of `files` to bring with it, in the order they are written (the
// HLO last: an entry with its HLO is taken as whole): its flags (LNL: command.txt and
// LNL's metadata), then its HLO. Only those `files` has.
inline std::vector<std::string> input_names(const EntryFiles& files) {
  std::vector<std::string> out;
  if (files.has(EntryFile::flags)) out.emplace_back(files.flags_name());
  if (files.is_lnl() && files.has(EntryFile::metadata)) out.emplace_back(k_lnl_metadata_file);
  if (auto hlo = files.hlo_name()) out.emplace_back(*hlo);
  return out;
}

// Uploads a compile's result to the entry at `base` whose objects are `files`, under the
// entry's lease only: the NEFF at `neff` (LNL: with the compiler's log, which LNL keeps
// beside it, when there is one), then the done marker, created only if absent (LNL's
// marker says how large the NEFF is), and drops a failure recorded before. Every compile
// that publishes to S3 goes through here (sync copies whole entries its own way).
inline Result<void> upload_s3_result(S3Client& s3, const std::string& base, const EntryFiles& files,
                                     const std::string& neff) {
  const std::string beside = std::filesystem::path(neff).parent_path().string();
  auto up = [&](std::string_view name, const std::string& from, const PutCondition& cond = {}) {
    return s3.upload(fmt::format("{}/{}", base, name), from, cond);
  };
  // A NEFF still being written (a copy of an entry whose marker came first) must not
  // become the entry's for every host: it goes up only if unchanged during the upload.
  struct stat before {}, after {};
  if (::stat(neff.c_str(), &before) != 0) return sys_error("stat", neff);
  if (auto n = up(files.neff_name(), neff); !n) return n.error();
  if (::stat(neff.c_str(), &after) != 0) return sys_error("stat", neff);
  if (after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
      after.st_mtim.tv_nsec != before.st_mtim.tv_nsec || after.st_ino != before.st_ino)
    return Error{Errc::io, fmt::format("{} changed while it was uploaded", neff)};
  const std::string log = fmt::format("{}/{}", beside, k_lnl_log_file);
  if (files.is_lnl() && ::access(log.c_str(), F_OK) == 0)
    if (auto l = up(k_lnl_log_file, log); !l) return l.error();
  auto done = files.is_lnl() ? up(files.done_name(), fmt::format("{}/{}", beside, files.done_name()), {.if_absent = true})
                             : s3.put(fmt::format("{}/{}", base, k_done_file), "", {.if_absent = true});
  if (!done && done.error().code != Errc::precondition_failed) return done.error();
  if (files.has(EntryFile::log)) (void)s3.remove(fmt::format("{}/{}", base, files.failure_name()));  // a retried failure
  return {};
}

}  // namespace detail

struct S3CompileOptions {
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
inline CompileResult compile_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel,
                                      const CompileSettings& s, const S3CompileOptions& o = {}) {
  CompileResult r;
  auto transient = [&](std::string why) {
    r.outcome = CompileOutcome::transient;
    r.message = std::move(why);
    return r;
  };
  const std::string base = s3_key(prefix, rel);
  auto files_now = [&]() -> Result<EntryFiles> {
    auto names = detail::s3_entry_names(s3, base);
    if (!names) return names.error();
    return detail::files_named(rel, *names);
  };
  auto files = files_now();
  if (!files) return transient(files.error().message);
  if (auto settled = settled_outcome(*files, s.retry_failed)) return r.outcome = *settled, r;
  if (!files->has_hlo()) return transient(fmt::format("{}: no HLO to compile", s3.describe(base)));
  if (!s.compiles_off.empty()) return refused(r, s3.describe(base), s);
  if (auto serves = compiler_serves(rel, s); !serves) {
    r.refused = true;
    return transient(serves.error().message);
  }

  auto lease = S3Lease::acquire(s3, fmt::format("{}/{}", base, files->s3_lock_name()), o.lease_ttl, o.host);
  if (!lease) {
    r.outcome = lease.error().code == Errc::busy ? CompileOutcome::busy : CompileOutcome::transient;
    r.message = lease.error().message;
    return r;
  }
  auto finish = [&](CompileResult res) {
    lease->finish(is_success(res.outcome) ? S3Lease::Entry::settled : S3Lease::Entry::open);
    return res;
  };
  files = files_now();
  if (!files) return finish(transient(files.error().message));
  if (auto settled = settled_outcome(*files, s.retry_failed)) return r.outcome = *settled, finish(r);
  if (!files->has_hlo()) return finish(transient(fmt::format("{}: no HLO to compile", s3.describe(base))));

  // The staging entry keeps the entry's own folder names: the compiler sees the same
  // file names as in a directory cache.
  std::string root = s.workdir_root.empty() ? detail::getenv_or("TMPDIR", "/tmp") : s.workdir_root;
  std::string tmpl = fmt::format("{}/neffcache-s3-XXXXXX", root);
  if (!sys::mkdtemp(tmpl.data())) return finish(transient(sys_error("create staging directory in", root).message));
  struct Cleanup {
    std::string dir;
    ~Cleanup() { detail::remove_tree_at(AT_FDCWD, dir); }
  } cleanup{tmpl};
  const std::string entry_dir = fmt::format("{}/{}", tmpl, rel);
  std::error_code ec;
  std::filesystem::create_directories(entry_dir, ec);
  if (ec) return finish(transient(fmt::format("create {}: {}", entry_dir, ec.message())));
  for (const auto& name : detail::input_names(*files)) {
    auto got = s3.download(fmt::format("{}/{}", base, name), fmt::format("{}/{}", entry_dir, name));
    if (!got) return finish(transient(got.error().message));
  }
  // The NKI kernels the graph calls, from the bucket when this host lacks them (an
  // unreadable HLO calls none we can name: its compile says what is wrong with it).
  if (auto called = kernels_called(fmt::format("{}/{}", entry_dir, *files->hlo_name())))
    if (auto fetched = fetch_nki_kernels(s3, prefix, o.nki_kernels, *called); !fetched)
      return finish(transient(fetched.error().message));

  CompileSettings local = s;
  std::string lost;
  auto last_renewal = std::chrono::steady_clock::now();
  local.cancelled = [&] {
    if (s.cancelled && s.cancelled()) return true;
    if (std::chrono::steady_clock::now() - last_renewal < lease->renew_interval()) return false;
    last_renewal = std::chrono::steady_clock::now();
    // A renewal that fails for the network is tried again next time; only a lease
    // taken over is final.
    if (auto renewed = lease->renew(); !renewed && renewed.error().code == Errc::precondition_failed)
      lost = renewed.error().message;
    return !lost.empty();
  };
  // (Its result is handed back whole: an OOM kill's oom_killed and peak_rss_kib too, for
  // a scheduler that retries it with more memory.)
  CompileResult local_result = compile_entry(entry_dir, local);
  if (!lost.empty()) {
    // Taken over elsewhere: final here, whatever ended the compiler.
    local_result.outcome = CompileOutcome::transient;
    local_result.message = std::move(lost);
    local_result.oom_killed = false;
    return finish(local_result);
  }
  if (local_result.outcome != CompileOutcome::success && local_result.outcome != CompileOutcome::failed)
    return finish(local_result);
  // Publish only while the lease is still ours.
  if (auto renewed = lease->renew(); !renewed) return finish(transient(renewed.error().message));
  if (local_result.outcome == CompileOutcome::failed) {
    auto f = s3.upload(fmt::format("{}/{}", base, files->failure_name()),
                       fmt::format("{}/{}", entry_dir, files->failure_name()));
    if (!f) return finish(transient(f.error().message));
    return finish(local_result);
  }
  if (auto up = detail::upload_s3_result(s3, base, *files, fmt::format("{}/{}", entry_dir, files->neff_name())); !up)
    return finish(transient(up.error().message));
  if (o.published) o.published(entry_dir);
  return finish(local_result);
}

// Puts on S3 the NEFF that someone else compiled into the local entry folder `entry_dir`
// (done there) for the entry `rel`, under its lease `lease` (the caller's), unless S3 has
// the entry done already. True if it went up. The lease is given back either way: its
// object deleted once the entry is done (as after a compile), else released.
inline Result<bool> publish_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel,
                                     const std::string& entry_dir, S3Lease lease) {
  const std::string base = s3_key(prefix, rel);
  auto give_back = [&](bool done) { lease.finish(done ? S3Lease::Entry::settled : S3Lease::Entry::open); };
  // Publish only while the lease is still ours.
  if (auto renewed = lease.renew(); !renewed) return give_back(false), renewed.error();
  auto names = detail::s3_entry_names(s3, base);
  if (!names) return give_back(false), names.error();
  const EntryFiles files = detail::files_named(rel, *names);
  if (files.done()) return give_back(true), false;
  auto up = detail::upload_s3_result(s3, base, files, fmt::format("{}/{}", entry_dir, files.neff_name()));
  give_back(static_cast<bool>(up));
  if (!up) return up.error();
  return true;
}

// Maintenance of S3 entries, each change made under the entry's lease as on a directory
// (maintenance.hpp): an entry being compiled on any host is left alone (Errc::busy).

// Stores a graph as graph extraction does, in the S3 entry `rel`: compile_flags.json,
// then the HLO, created only if absent. False when the entry already had its HLO.
inline Result<bool> store_s3_graph(S3Client& s3, const std::string& prefix, const std::string& rel,
                                   std::string_view hlo_bytes, const std::vector<std::string>& flags) {
  const std::string base = s3_key(prefix, rel);
  auto hlo = s3.head(fmt::format("{}/{}", base, k_hlo_module_file));
  if (hlo) return false;
  if (hlo.error().code != Errc::not_found) return hlo.error();
  if (auto f = s3.put(fmt::format("{}/{}", base, k_compile_flags_file), python_json_list(flags)); !f) return f.error();
  auto created = s3.put(fmt::format("{}/{}", base, k_hlo_module_file), hlo_bytes, {.if_absent = true});
  if (!created && created.error().code == Errc::precondition_failed) return false;
  if (!created) return created.error();
  return true;
}

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

inline Result<void> remove_s3_objects(S3Client& s3, const std::string& base, const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (auto r = s3.remove(fmt::format("{}/{}", base, n)); !r) return r;
  return {};
}

}  // namespace detail

// Forgets a recorded failure (model.log without model.neff; LNL: our failure record).
// False when there was none.
inline Result<bool> clear_s3_failure(S3Client& s3, const std::string& prefix, const std::string& rel) {
  bool cleared = false;
  auto r = detail::with_s3_lease(s3, prefix, rel, [&](const std::vector<std::string>& names) -> Result<void> {
    const EntryFiles files = detail::files_named(rel, names);
    if (!files.failed()) return {};
    cleared = true;
    return detail::remove_s3_objects(s3, s3_key(prefix, rel), {std::string(files.failure_name())});
  });
  if (!r) return r.error();
  return cleared;
}

// Removes the results (the done marker first, so the entry stops being done at once,
// then the rest, as detail::result_names lists them): the entry is pending again.
inline Result<void> clear_s3_results(S3Client& s3, const std::string& prefix, const std::string& rel) {
  return detail::with_s3_lease(s3, prefix, rel, [&](const std::vector<std::string>& names) {
    return detail::remove_s3_objects(s3, s3_key(prefix, rel), detail::result_names(detail::files_named(rel, names)));
  });
}

// Removes every object of an entry: results first, then the rest, the lease last.
inline Result<void> remove_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel) {
  return detail::with_s3_lease(s3, prefix, rel, [&](const std::vector<std::string>& names) -> Result<void> {
    const std::string base = s3_key(prefix, rel);
    const EntryFiles files = detail::files_named(rel, names);
    const std::string done(files.done_name()), neff = files.neff_name(), lock = files.s3_lock_name();
    if (auto r = detail::remove_s3_objects(s3, base, {done, neff}); !r) return r;
    std::vector<std::string> rest;
    for (const auto& n : names)
      if (n != done && n != neff && n != lock) rest.push_back(n);
    return detail::remove_s3_objects(s3, base, rest);
  });
}

// Removes an entry's lease when it has expired (its holder died or was cut off) by
// taking it over and deleting it; Errc::busy naming the holder when it is live. A
// released lease is removed too. Returns what the lease was.
inline Result<LeaseInfo> clear_s3_stale_lock(S3Client& s3, const std::string& prefix, const std::string& rel,
                                             const EntryFiles& files) {
  const std::string key = fmt::format("{}/{}", s3_key(prefix, rel), files.s3_lock_name());
  auto before = read_lease(s3, key);
  if (!before) return before.error();
  auto r = detail::with_s3_lease(s3, prefix, rel, [](const std::vector<std::string>&) -> Result<void> { return {}; });
  if (!r) return r.error();
  return before;
}

}  // namespace neffcache
