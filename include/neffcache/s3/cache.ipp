// Definitions of s3/cache.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/cache.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/index.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/core/detail/fs.hpp>

namespace neffcache {

NEFFCACHE_DECL std::map<std::string, S3EntryObjects> group_s3_entries(const std::vector<ObjectInfo>& objects,
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

NEFFCACHE_DECL EntryState s3_entry_state(S3Client& s3, const std::string& prefix, const std::string& rel,
                                         EntryFiles files) {
  constexpr auto lock_bits = static_cast<uint16_t>(static_cast<uint16_t>(EntryFile::lock_module) |
                                                  static_cast<uint16_t>(EntryFile::lock_legacy));
  if (files.has_lock() && !files.done()) {
    auto lease = read_lease(s3, fmt::format("{}/{}", s3_key(prefix, rel), files.s3_lock_name()));
    bool gone = lease ? lease->record && lease->record->released : lease.error().code == Errc::not_found;
    if (!gone) return lease && lease->expired ? EntryState::stale_lock : EntryState::compiling;
    files.bits &= static_cast<uint16_t>(~lock_bits);
  }
  // (Any lock left is live; an LNL entry's lock is asked for whenever it is not done.)
  return classify(files, [&] { return files.has_lock(); });
}

NEFFCACHE_DECL Result<std::vector<EntryInfo>> list_s3_entries(S3Client& s3, const std::string& prefix) {
  auto listing = s3.list(prefix.empty() ? "" : prefix + "/");
  if (!listing) return listing.error();
  std::vector<EntryInfo> out;
  for (const auto& [rel, objects] : group_s3_entries(listing->objects, prefix)) {
    EntryInfo info;
    info.path = rel;
    info.files = s3_entry_files(rel, objects);
    info.state = s3_entry_state(s3, prefix, rel, info.files);
    const std::string neff = info.files.neff_name();
    bool record = false;
    for (const auto& [name, o] : objects) {
      info.bytes += o.size;
      info.last_use = std::max(info.last_use, o.modified);
      if (name == neff) info.neff_bytes = o.size;
      record = record || name == k_meta_file;
    }
    // A done entry's record (a twin's, or one a push carried up): one more request.
    if (record && info.state == EntryState::done)
      if (auto text = s3.get(fmt::format("{}/{}", s3_key(prefix, rel), k_meta_file)))
        detail::note_record(info, nlohmann::json::parse(*text, nullptr, false));
    out.push_back(std::move(info));
  }
  return out;
}

namespace detail {

NEFFCACHE_DECL Result<std::vector<std::string>> s3_entry_names(S3Client& s3, const std::string& base) {
  auto l = s3.list(base + "/", "/");
  if (!l) return l.error();
  std::vector<std::string> out;
  for (const auto& o : l->objects) out.push_back(o.key.substr(base.size() + 1));
  return out;
}

NEFFCACHE_DECL std::vector<std::string> input_names(const EntryFiles& files) {
  std::vector<std::string> out;
  if (files.has(EntryFile::flags)) out.emplace_back(files.flags_name());
  if (files.is_lnl() && files.has(EntryFile::metadata)) out.emplace_back(k_lnl_metadata_file);
  if (auto hlo = files.hlo_name()) out.emplace_back(*hlo);
  return out;
}

NEFFCACHE_DECL Result<std::string> stage_s3_inputs(S3Client& s3, const std::string& prefix, const std::string& rel,
                                                   const EntryFiles& files, const std::string& root,
                                                   std::string& made) {
  std::string tmpl = fmt::format("{}/neffcache-s3-XXXXXX", root);
  if (!sys::mkdtemp(tmpl.data())) return sys_error("create staging directory in", root);
  made = tmpl;
  const std::string dir = fmt::format("{}/{}", tmpl, rel);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Error{Errc::io, fmt::format("create {}: {}", dir, ec.message())};
  for (const auto& name : input_names(files))
    if (auto got = s3.download(fmt::format("{}/{}", s3_key(prefix, rel), name), fmt::format("{}/{}", dir, name)); !got)
      return got.error();
  return dir;
}

NEFFCACHE_DECL Result<void> upload_s3_result(S3Client& s3, const std::string& base, const EntryFiles& files,
                                             const std::string& neff) {
  const std::string beside = std::filesystem::path(neff).parent_path().string();
  auto up = [&](std::string_view name, const std::string& from, const PutCondition& cond = {}) {
    return s3.upload(fmt::format("{}/{}", base, name), from, cond);
  };
  // A NEFF still being written (a copy of an entry whose marker came first) must not
  // become the entry's for every host: it goes up only if unchanged during the upload.
  struct stat before {}, after {};
  if (::stat(neff.c_str(), &before) != 0) return sys_error("stat", neff);
  auto n = up(files.neff_name(), neff);
  if (!n) return n.error();
  if (::stat(neff.c_str(), &after) != 0) return sys_error("stat", neff);
  if (after.st_size != before.st_size || after.st_mtim.tv_sec != before.st_mtim.tv_sec ||
      after.st_mtim.tv_nsec != before.st_mtim.tv_nsec || after.st_ino != before.st_ino)
    return Error{Errc::io, fmt::format("{} changed while it was uploaded", neff)};
  if (!files.is_lnl()) return mark_s3_done(s3, base, files, {});
  const std::string log = fmt::format("{}/{}", beside, k_lnl_log_file);
  if (::access(log.c_str(), F_OK) == 0)
    if (auto l = up(k_lnl_log_file, log); !l) return l.error();
  // Our record's compiler version, which the entry's identity names (s3/index.hpp), from
  // our own place only (never the folder's, which a client may write). Best effort: without
  // it the entry has no identity, as a folder's without our record, and a record of an
  // earlier NEFF goes.
  const std::string record = fmt::format("{}/{}", base, k_meta_file);
  auto v = recorded_compiler_version(beside, /*legacy=*/false);
  if (v && !n->etag.empty())
    (void)s3.put(record, s3_lnl_record(*v, static_cast<uint64_t>(after.st_size), n->etag).dump() + "\n");
  else
    (void)s3.remove(record);
  auto marker = read_file(fmt::format("{}/{}", beside, k_lnl_marker_file));
  if (!marker) return marker.error();
  return mark_s3_done(s3, base, files, *marker);
}

NEFFCACHE_DECL nlohmann::ordered_json s3_lnl_record(std::string_view compiler_version, uint64_t neff_bytes,
                                                    std::string_view etag) {
  return {{"compiler_version", compiler_version}, {"size", neff_bytes}, {"etag", etag}};
}

NEFFCACHE_DECL Result<void> mark_s3_done(S3Client& s3, const std::string& base, const EntryFiles& files,
                                         std::string_view lnl_marker) {
  auto done = s3.put(fmt::format("{}/{}", base, files.done_name()), files.is_lnl() ? lnl_marker : std::string_view(),
                     {.if_absent = true});
  if (!done && done.error().code != Errc::precondition_failed) return done.error();
  if (files.has(EntryFile::log))  // a retried failure
    (void)s3.remove(fmt::format("{}/{}", base, files.failure_name()));
  return {};
}

}  // namespace detail

NEFFCACHE_DECL Result<EntryFiles> S3Entry::files() const {
  auto names = detail::s3_entry_names(s3_, base_);
  if (!names) return names.error();
  return detail::files_named(rel_, *names);
}

NEFFCACHE_DECL Result<std::unique_ptr<EntryHold>> S3Entry::take(const EntryFiles& files) {
  auto lease = S3Lease::acquire(s3_, fmt::format("{}/{}", base_, files.s3_lock_name()), ttl_, host_);
  if (!lease) return lease.error();
  return std::unique_ptr<EntryHold>(std::make_unique<LeaseHold>(std::move(*lease)));
}

NEFFCACHE_DECL Result<std::string> S3Entry::publish(const EntryFiles& files, const Produced& p) {
  if (auto up = detail::upload_s3_result(s3_, base_, files, p.neff); !up) return up.error();
  return describe();
}

NEFFCACHE_DECL Result<void> S3Entry::record_failure(const EntryFiles& files, const std::string& log) {
  if (auto up = s3_.upload(fmt::format("{}/{}", base_, files.failure_name()), log); !up) return up.error();
  return {};
}

NEFFCACHE_DECL CompileResult compile_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel,
                                              const CompileSettings& s, const S3CompileOptions& o) {
  S3Entry entry(s3, prefix, rel, o.lease_ttl, o.host);
  auto transient = [](std::string why) { return CompileResult::of(CompileOutcome::transient, std::move(why)); };
  detail::RemovedTree staging;  // (outlives the run: its NEFF or log is published from there)
  // The entry's inputs, downloaded once (under the lease) into a staging entry: the
  // compiler sees the same file names as in a directory cache. Returns its folder.
  std::string entry_dir;
  auto stage = [&](const EntryFiles& files) -> Result<std::string> {
    if (!entry_dir.empty()) return entry_dir;
    staging.reset();  // (a try that failed)
    const std::string root = s.workdir_root.empty() ? detail::getenv_or("TMPDIR", "/tmp") : s.workdir_root;
    auto dir = detail::stage_s3_inputs(s3, prefix, rel, files, root, staging.dir);
    if (!dir) return dir.error();
    return entry_dir = *dir;
  };
  HeldCompile how;
  how.look = [&](const EntryFiles& files, bool held) -> std::optional<CompileResult> {
    if (auto settled = settled_outcome(files, s.retry_failed)) return CompileResult::of(*settled);
    if (!files.has_hlo()) return transient(fmt::format("{}: no HLO to compile", entry.describe()));
    if (held && o.reuse) {
      // (Inputs that cannot be staged are the run step's to report.)
      if (auto dir = stage(files)) return o.reuse(rel, *dir, files, s);
    }
    if (held) return std::nullopt;
    CompileResult r;
    if (!s.compiles_off.empty()) return refused(r, entry.describe(), s);
    if (auto serves = compiler_serves(rel, s); !serves) {
      r = transient(serves.error().message);
      r.refused = true;
      return r;
    }
    return std::nullopt;
  };
  return compile_held(entry, how, [&](const EntryFiles& files, EntryHold& hold) -> Ran {
    Ran out;
    auto stop = [&](std::string why) {
      out.result = transient(std::move(why));
      return std::move(out);
    };
    if (auto staged = stage(files); !staged) return stop(staged.error().message);
    // The NKI kernels the graph calls, from the bucket when this host lacks them (an
    // unreadable HLO calls none we can name: its compile says what is wrong with it).
    if (auto called = kernels_called(fmt::format("{}/{}", entry_dir, *files.hlo_name())))
      if (auto fetched = fetch_nki_kernels(s3, prefix, o.nki_kernels, *called); !fetched)
        return stop(fetched.error().message);

    CompileSettings local = s;
    local.cancelled = [&] { return (s.cancelled && s.cancelled()) || hold.lost(); };
    // (Its result is handed back whole: an OOM kill's oom_killed and peak_rss_kib too, for
    // a scheduler that retries it with more memory.)
    out.result = compile_entry(entry_dir, local);
    out.produced.neff = fmt::format("{}/{}", entry_dir, files.neff_name());
    // Once the NEFF is on S3, under the lease: recorded in the index, then taken by the
    // caller (which may move it out of the staging entry).
    out.produced.on_published = [&o, &s, &rel, entry_dir, result = out.result](const std::string&) {
      if (o.record) o.record(rel, entry_dir, result, s);
      if (o.published) o.published(entry_dir);
    };
    out.failure_log = own_files(entry_dir).failure;
    // A failure on S3, recorded in the index too, still under the lease.
    out.on_failure_recorded = [&o, &s, &rel, entry_dir, result = out.result] {
      if (o.record && result.attempts > 0) o.record(rel, entry_dir, result, s);
    };
    return out;
  });
}

NEFFCACHE_DECL Result<bool> publish_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel,
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

NEFFCACHE_DECL Result<bool> store_s3_graph(S3Client& s3, const std::string& prefix, const std::string& rel,
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

NEFFCACHE_DECL Result<void> remove_s3_objects(S3Client& s3, const std::string& base,
                                              const std::vector<std::string>& names) {
  for (const auto& n : names)
    if (auto r = s3.remove(fmt::format("{}/{}", base, n)); !r) return r;
  return {};
}

}  // namespace detail

NEFFCACHE_DECL Result<bool> clear_s3_failure(S3Client& s3, const std::string& prefix, const std::string& rel) {
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

NEFFCACHE_DECL Result<void> clear_s3_results(S3Client& s3, const std::string& prefix, const std::string& rel) {
  return detail::with_s3_lease(s3, prefix, rel, [&](const std::vector<std::string>& names) {
    return detail::remove_s3_objects(s3, s3_key(prefix, rel), detail::result_names(detail::files_named(rel, names)));
  });
}

NEFFCACHE_DECL Result<void> remove_s3_entry(S3Client& s3, const std::string& prefix, const std::string& rel) {
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

NEFFCACHE_DECL Result<LeaseInfo> clear_s3_stale_lock(S3Client& s3, const std::string& prefix, const std::string& rel,
                                                     const EntryFiles& files) {
  const std::string key = fmt::format("{}/{}", s3_key(prefix, rel), files.s3_lock_name());
  auto before = read_lease(s3, key);
  if (!before) return before.error();
  auto r = detail::with_s3_lease(s3, prefix, rel, [](const std::vector<std::string>&) -> Result<void> { return {}; });
  if (!r) return r.error();
  return before;
}

}  // namespace neffcache
