// Definitions of s3/tier.hpp (core/decl.hpp): the tier's steps on one entry, which the
// public calls of tier.ipp take: a client's NEFF published, a stand-in for a client's
// compile, an entry's inputs fetched and uploaded, its NEFF fetched or its twin linked, a
// failure or a staged NEFF taken, and the NEFFs kept under the size cap.
#pragma once

#include <neffcache/s3/tier.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/compile/twin.hpp>

namespace neffcache {

NEFFCACHE_DECL CompileResult S3Tier::publish_here(const std::string& entry_dir, const std::string& rel,
                                                  std::optional<S3Lease> lease) {
  auto fail = [&](const Error& e) {
    if (lease) (void)lease->release();
    return CompileResult::of(e.code == Errc::busy ? CompileOutcome::busy : CompileOutcome::transient, e.message);
  };
  const std::string base = s3_key(o_.prefix, rel);
  auto names = detail::s3_entry_names(*s3_, base);
  if (!names) return fail(names.error());
  const EntryFiles remote = detail::files_named(rel, *names);
  auto kept = [&] {
    struct stat st {};
    if (::stat(fmt::format("{}/{}", entry_dir, remote.neff_name()).c_str(), &st) == 0)
      keep(entry_dir, static_cast<uint64_t>(st.st_size));
    return CompileResult::of(CompileOutcome::already_done, "");
  };
  // The bucket has it (another host's, or ours published already): nothing to take.
  if (!lease && remote.done()) return kept();
  if (!lease) {
    auto here = read_entry_files(entry_dir);
    if (!here) return fail(here.error());
    auto taken = S3Lease::acquire(*s3_, fmt::format("{}/{}", base, lease_name(remote, *here)), o_.compile.lease_ttl,
                                  o_.compile.host);
    if (!taken) return fail(taken.error());
    lease.emplace(std::move(*taken));
  }
  if (auto in = upload_missing_inputs(entry_dir, rel, remote); !in) return fail(in.error());
  auto up = publish_s3_entry(*s3_, o_.prefix, rel, entry_dir, std::move(*lease));
  lease.reset();
  if (!up) return fail(up.error());
  if (*up) ++counters_.published;
  return kept();
}

NEFFCACHE_DECL CompileResult S3Tier::stand_in(const std::string& entry_dir, const std::string& rel,
                                              const EntryFiles& remote, const EntryFiles& here, std::string why) {
  CompileResult busy = CompileResult::of(CompileOutcome::busy, std::move(why));
  const std::optional<bool> live = stand_ins_.live(entry_dir);
  if (live && !*live) return busy;  // another host has it now: ours went
  if (!live) {
    auto lease = S3Lease::acquire(*s3_, fmt::format("{}/{}", s3_key(o_.prefix, rel), lease_name(remote, here)),
                                  o_.compile.lease_ttl, o_.compile.host);
    if (!lease) return busy;
    stand_ins_.put(entry_dir, detail::StandIns::Held(std::move(*lease)));
  }
  (void)upload_missing_inputs(entry_dir, rel, remote);  // (a failure is tried again at the next look)
  return busy;
}

NEFFCACHE_DECL bool S3Tier::fill_entry(const std::string& rel) {
  const std::string dir = fmt::format("{}/{}", o_.root, rel);
  if (auto here = read_entry_files(dir); here && here->has_hlo()) {
    // A failure here that the bucket has since made good (another host retried the graph
    // and published it): done wins, as model.done does in a folder both hosts share. The
    // record goes, and the entry's next look finds the NEFF, fetched at its open. (A
    // client's look: within the bound, at most once in RecentLooks::k_recheck.)
    if (here->failed() && !here->done() && !unanswered() && looks_.again(rel)) {
      auto names = detail::s3_entry_names(*quick_, s3_key(o_.prefix, rel));
      if (!names) note_unanswered(names.error());
      else if (detail::files_named(rel, *names).done()) sys::unlink(failure_record(dir).c_str());
    }
    return true;
  }
  return looks_.single_flight(rel, [&] { return fetch_inputs(rel, dir); });
}

NEFFCACHE_DECL bool S3Tier::fetch_inputs(const std::string& rel, const std::string& dir) {
  if (!looks_.again(rel)) return false;
  const std::string base = s3_key(o_.prefix, rel);
  auto names = detail::s3_entry_names(*s3_, base);
  ++counters_.lookups;
  if (!names) return false;
  EntryFiles remote = detail::files_named(rel, *names);
  if (!remote.has_hlo() || !make_dir(dir)) return false;
  // The flags first: an entry with its HLO here is taken as whole. (LNL's text files
  // come too, as a copy of the entry would have them.)
  std::vector<std::string> inputs;
  if (remote.is_lnl())
    for (std::string_view text : {k_lnl_fxgraph_file, k_lnl_example_inputs_file})
      if (std::find(names->begin(), names->end(), text) != names->end()) inputs.emplace_back(text);
  for (auto& name : detail::input_names(remote)) inputs.push_back(std::move(name));
  for (const std::string& name : inputs) {
    const std::string path = fmt::format("{}/{}", dir, name);
    if (::access(path.c_str(), F_OK) == 0) continue;
    if (!s3_->download(fmt::format("{}/{}", base, name), path)) return false;
  }
  // A failed entry shows its failure here from the start, as the bucket holds it.
  take_failure(*s3_, dir, base, remote);
  return true;
}

NEFFCACHE_DECL Result<bool> S3Tier::upload_missing_inputs(const std::string& entry_dir, const std::string& rel,
                                                          const EntryFiles& remote) {
  if (remote.has_hlo()) return false;
  auto here = read_entry_files(entry_dir);
  if (!here) return here.error();
  if (!here->has_hlo()) return Error{Errc::not_found, fmt::format("{}: no HLO here or on S3", entry_dir)};
  const std::string base = s3_key(o_.prefix, rel);
  const std::string_view hlo = *here->hlo_name();
  if (auto k = upload_kernels(fmt::format("{}/{}", entry_dir, hlo)); !k) return k.error();
  for (const auto& name : detail::input_names(*here)) {
    if (name == hlo) continue;
    auto f = s3_->upload(fmt::format("{}/{}", base, name), fmt::format("{}/{}", entry_dir, name));
    if (!f) return f.error();
  }
  auto h = s3_->upload(fmt::format("{}/{}", base, hlo), fmt::format("{}/{}", entry_dir, hlo), {.if_absent = true});
  if (!h && h.error().code == Errc::precondition_failed) return false;  // another host's, just now
  if (!h) return h.error();
  ++counters_.uploads;
  return true;
}

NEFFCACHE_DECL Result<void> S3Tier::upload_kernels(const std::string& hlo_path) {
  auto called = kernels_called(hlo_path);
  if (!called || called->empty()) return {};
  auto t = push_nki_kernels(*s3_, o_.prefix, o_.compile.nki_kernels, *called);
  if (!t) return t.error();
  counters_.uploads += t->copied;
  return {};
}

NEFFCACHE_DECL CompileResult S3Tier::fetch(const std::string& entry_dir, const std::string& base,
                                           const EntryFiles& remote, bool twin_record) {
  if (twin_record && !remote.is_lnl() && link_twin(entry_dir, base))
    return CompileResult::of(CompileOutcome::already_done, "");
  auto place = [&](std::string_view name) -> Result<uint64_t> {
    const std::string to = fmt::format("{}/{}", entry_dir, name);
    const std::string part = fmt::format("{}/fetch-{}", staging(), detail::random_hex64());
    auto got = s3_->download(fmt::format("{}/{}", base, name), part);
    if (!got) return got.error();
    if (sys::rename(part.c_str(), to.c_str()) != 0) {
      Error e = sys_error("publish", to);
      sys::unlink(part.c_str());
      return e;
    }
    return got->size;
  };
  const std::string neff = remote.neff_name();
  auto got = place(neff);
  if (!got) return transient(got.error().message);
  if (remote.is_lnl() && remote.has(EntryFile::compiler_log)) (void)place(k_lnl_log_file);
  Result<void> done;
  if (!remote.is_lnl()) done = detail::write_file_atomic(fmt::format("{}/{}", entry_dir, k_done_file), "");
  else if (auto marker = place(remote.done_name()); !marker) done = marker.error();
  if (!done) {
    sys::unlink(fmt::format("{}/{}", entry_dir, neff).c_str());
    return transient(done.error().message);
  }
  ++counters_.fetches;
  counters_.fetched_bytes += *got;
  keep(entry_dir, *got);
  return CompileResult::of(CompileOutcome::already_done, "");
}

NEFFCACHE_DECL bool S3Tier::link_twin(const std::string& entry_dir, const std::string& base) {
  auto text = s3_->get(fmt::format("{}/{}", base, k_meta_file));
  if (!text) return false;
  auto record = nlohmann::json::parse(*text, nullptr, false);
  if (!record.is_object() || !record.contains("copied_from") || !record["copied_from"].is_string() ||
      !record.contains("xxh3") || !record["xxh3"].is_string())
    return false;
  const std::string from = record["copied_from"].get<std::string>();
  if (!is_entry_path(from) || from.find("..") != std::string::npos) return false;
  Twin twin;
  twin.dir = fmt::format("{}/{}", o_.root, from);
  auto files = read_entry_files(twin.dir);
  if (!files || !files->done() || files->is_lnl()) return false;
  struct stat st {};
  auto fd = detail::open_regular(fmt::format("{}/{}", twin.dir, files->neff_name()), &st);
  if (!fd) return false;
  // The very NEFF the bucket's twin holds, by its checksum (from its record here when that
  // describes the file, else read from it).
  auto h = detail::neff_xxh3(twin.dir, fd->get(), st);
  if (!h || *h != record["xxh3"].get<std::string>()) return false;
  // And of the size the bucket's NEFF has (one HEAD, not its bytes).
  auto there = s3_->head(fmt::format("{}/{}", base, files->neff_name()));
  if (!there || there->size != static_cast<uint64_t>(st.st_size)) return false;
  twin.record.entry = from;
  twin.record.xxh3 = std::move(*h);
  twin.record.size = static_cast<uint64_t>(st.st_size);
  twin.record.compile_seconds = record.value("compile_seconds_saved", 0.0);
  twin.neff = std::move(*fd);
  if (!detail::publish_twin_neff(twin, entry_dir, EntryFiles::of_entry_path(entry_dir), std::nullopt, std::nullopt))
    return false;
  keep(entry_dir, twin.record.size);
  return true;
}

NEFFCACHE_DECL void S3Tier::take_failure(S3Client& via, const std::string& entry_dir, const std::string& base,
                                         const EntryFiles& remote) {
  if (!remote.failed() || remote.done()) return;
  auto here = read_entry_files(entry_dir);
  if (!here || here->done() || here->failed()) return;
  const OwnFiles own = own_files(entry_dir);
  if (!own.make()) return;
  const std::string part = own.temporary("log");
  if (auto got = via.download(fmt::format("{}/{}", base, remote.failure_name()), part); !got) {
    if (&via == quick_.get()) note_unanswered(got.error());
    return (void)sys::unlink(part.c_str());
  }
  if (sys::rename(part.c_str(), own.failure.c_str()) != 0) sys::unlink(part.c_str());
}

NEFFCACHE_DECL void S3Tier::take_staged(const std::string& entry_dir, const std::string& staged) {
  const EntryFiles files = EntryFiles::of_entry_path(entry_dir);
  auto move = [&](std::string_view name) {
    return sys::rename(fmt::format("{}/{}", staged, name).c_str(), fmt::format("{}/{}", entry_dir, name).c_str()) == 0;
  };
  const std::string neff = files.neff_name();
  struct stat st {};
  if (::stat(fmt::format("{}/{}", staged, neff).c_str(), &st) != 0 || !move(neff)) return;  // fetched instead
  if (files.is_lnl()) (void)move(k_lnl_log_file);
  if (!move(files.done_name())) {
    sys::unlink(fmt::format("{}/{}", entry_dir, neff).c_str());
    return;
  }
  keep(entry_dir, static_cast<uint64_t>(st.st_size));
}

NEFFCACHE_DECL Result<std::vector<std::string>> S3Tier::publishable_files(const std::string& folder) {
  int fd = detail::open_dir_at(AT_FDCWD, folder.c_str());
  if (fd < 0) return sys_error("open", folder);
  detail::UniqueFd dir(::dup(fd));
  std::vector<std::string> rest;
  bool hlo = false, marker = false;
  auto listed = detail::list_dir(fd, folder, [&](std::string_view name, bool is_dir) {
    struct stat st {};
    if (is_dir || name.starts_with(k_private_prefix) ||
        ::fstatat(dir.get(), std::string(name).c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
      return;
    if (name == k_lnl_hlo_file) hlo = true;
    else if (name == k_lnl_marker_file) marker = true;
    else rest.emplace_back(name);
  });
  if (!listed) return listed.error();
  std::sort(rest.begin(), rest.end());
  if (hlo) rest.emplace_back(k_lnl_hlo_file);
  if (marker) rest.emplace_back(k_lnl_marker_file);
  return rest;
}

NEFFCACHE_DECL bool S3Tier::farm_looked_recently(const std::string& entry_dir) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard lk(farm_mu_);
  auto [it, added] = farm_looks_.try_emplace(entry_dir, now);
  if (!added && now - it->second < k_farm_recheck) return true;
  it->second = now;
  return false;
}

NEFFCACHE_DECL void S3Tier::keep(const std::string& entry_dir, uint64_t bytes) {
  for (const auto& e : kept_.keep(entry_dir, bytes)) evict(e);
}

NEFFCACHE_DECL void S3Tier::evict(const std::string& entry_dir) {
  auto rel = relative(entry_dir);
  if (!rel) return;
  const EntryFiles files = EntryFiles::of_entry_path(*rel);
  // Kept when S3 cannot be asked: it may not have it.
  if (!s3_->head(fmt::format("{}/{}", s3_key(o_.prefix, *rel), files.done_name()))) return;
  sys::unlink(fmt::format("{}/{}", entry_dir, files.done_name()).c_str());
  sys::unlink(fmt::format("{}/{}", entry_dir, files.neff_name()).c_str());
  ++counters_.evictions;
}

}  // namespace neffcache
