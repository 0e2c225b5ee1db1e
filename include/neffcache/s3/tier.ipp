// Definitions of s3/tier.hpp (core/decl.hpp): its public calls; the steps they take on one
// entry are in tier_steps.ipp.
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

NEFFCACHE_DECL S3Tier::S3Tier(std::unique_ptr<S3Client> s3, Options o)
    : s3_(std::move(s3)),
      quick_(s3_->quick()),
      o_(std::move(o)),
      kept_(o_.cap_bytes, o_.keep_after_use),
      slots_(o_.compile_slots) {
  // The bucket's content index, in the compiles under its leases (a read-only bucket
  // compiles none there).
  if (!o_.compile.reuse) o_.compile.reuse = s3_index_reuse(*s3_, o_.prefix);
  if (!o_.compile.record) o_.compile.record = s3_index_record(*s3_, o_.prefix);
  std::error_code ec;
  std::filesystem::create_directories(staging(), ec);
  kept_.scan(o_.root);
}

NEFFCACHE_DECL std::string S3Tier::staging() const { return fmt::format("{}/{}/staging", o_.root, k_private_prefix); }

NEFFCACHE_DECL bool S3Tier::fill(const std::string& dir, std::string_view name) {
  auto rel = relative(dir);
  if (!rel) return false;
  // A name in an entry: the entry's inputs. An LNL entry in the root.
  if (is_entry_path(*rel)) return fill_entry(*rel);
  if (rel->empty() && is_lnl_key(name)) return fill_entry(std::string(name));
  const int depth = depth_of(*rel);
  if (depth == 0 && name.starts_with(k_compiler_dir_prefix))
    return looks_.single_flight(std::string(name), [&] {
      if (!looks_.again(std::string(name))) return false;
      auto l = s3_->list(fmt::format("{}/", s3_key(o_.prefix, name)), "/", 1);
      ++counters_.lookups;
      return l && !(l->objects.empty() && l->prefixes.empty()) && make_dir(fmt::format("{}/{}", dir, name));
    });
  if (depth == 1 && name.starts_with(k_module_dir_prefix)) return fill_entry(fmt::format("{}/{}", *rel, name));
  return false;
}

NEFFCACHE_DECL void S3Tier::fill_listing(const std::string& dir) {
  auto rel = relative(dir);
  if (!rel) return;
  if (is_entry_path(*rel)) return (void)fill_entry(*rel);
  const int depth = depth_of(*rel);
  if (depth > 1 || !looks_.again(*rel + "/")) return;
  std::string base = rel->empty() ? o_.prefix : s3_key(o_.prefix, *rel);
  auto l = s3_->list(base.empty() ? "" : base + "/", "/");
  ++counters_.lookups;
  if (!l) return;
  for (const auto& p : l->prefixes) {
    std::string_view name = std::string_view(p).substr(base.empty() ? 0 : base.size() + 1);
    if (name.ends_with('/')) name.remove_suffix(1);
    const bool wanted = depth == 0 ? name.starts_with(k_compiler_dir_prefix) || is_lnl_key(name)
                                   : name.starts_with(k_module_dir_prefix);
    if (wanted && name.find('/') == std::string_view::npos) make_dir(fmt::format("{}/{}", dir, name));
  }
}

NEFFCACHE_DECL std::vector<std::string> S3Tier::names_elsewhere(const std::string& dir) {
  auto rel = relative(dir);
  if (!rel || !is_entry_path(*rel)) return {};
  auto here = read_entry_files(dir);
  if (!here || here->done()) return {};
  auto names = detail::s3_entry_names(*s3_, s3_key(o_.prefix, *rel));
  ++counters_.lookups;
  if (!names) return {};
  const EntryFiles remote = detail::files_named(*rel, *names);
  std::vector<std::string> out;
  if (remote.done()) {
    if (!here->has(EntryFile::neff)) out.push_back(remote.neff_name());
    if (!here->has(EntryFile::done)) out.emplace_back(remote.done_name());
    return out;
  }
  // Another host's live lease shows as the lock file it stands for.
  for (EntryFile lock : {EntryFile::lock_module, EntryFile::lock_legacy}) {
    if (remote.is_lnl() || !remote.has(lock) || here->has(lock)) continue;
    const std::string name = fmt::format("{}{}", lock == EntryFile::lock_module ? k_hlo_module_file : k_hlo_legacy_file,
                                         k_lock_suffix);
    if (held_elsewhere(dir, name)) out.push_back(name);
  }
  return out;
}

NEFFCACHE_DECL bool S3Tier::held_elsewhere(const std::string& entry_dir, std::string_view lock_name) {
  auto rel = relative(entry_dir);
  if (o_.read_only || !rel || !is_entry_path(*rel) || EntryFiles::of_entry_path(*rel).is_lnl() ||
      stand_ins_.holds(entry_dir) || unanswered())
    return false;
  auto lease = read_lease(*quick_, fmt::format("{}/{}", s3_key(o_.prefix, *rel), lock_name));
  ++counters_.lookups;
  if (lease || lease.error().code == Errc::not_found) note_answered();
  else note_unanswered(lease.error());
  if (lease && !lease->expired) return true;
  // No hold: a client that polled the lock looks for the finished entry next, and that
  // look must not reuse one from before the other host published it. (Not when S3 could
  // not be asked: the gate on looks then keeps the next lookups from waiting on it too.)
  if (lease || lease.error().code == Errc::not_found) looks_.forget(*rel);
  // A hold that ended may have ended in a recorded failure: the client finds it next,
  // as in a folder both hosts share. (Only for a graph this host knows: else it shows no
  // placeholder that could hide the failure.)
  // (Within the bound: this is a client's question.)
  if (lease && lease->record && lease->record->released)
    if (auto here = read_entry_files(entry_dir); here && here->has_hlo() && !here->done() && !here->failed()) {
      auto names = detail::s3_entry_names(*quick_, s3_key(o_.prefix, *rel));
      if (!names) note_unanswered(names.error());
      else take_failure(*quick_, entry_dir, s3_key(o_.prefix, *rel), detail::files_named(*rel, *names));
    }
  return false;
}

NEFFCACHE_DECL ClientHold S3Tier::hold_for_client(const std::string& entry_dir, std::string_view lock_name) {
  auto rel = relative(entry_dir);
  if (o_.read_only || !rel || !is_entry_path(*rel)) return {};
  if (stand_ins_.live(entry_dir) == std::optional<bool>(true)) return {ClientHold::taken};
  if (unanswered())
    return {ClientHold::here_only, fmt::format("it did not answer within {} s before", k_unanswered_pause.count())};
  const std::string key = fmt::format("{}/{}", s3_key(o_.prefix, *rel), lock_name);
  auto lease = S3Lease::acquire(*quick_, key, o_.compile.lease_ttl, o_.compile.host);
  if (lease) {
    note_answered();
    // Done in the bucket meanwhile (the client looked before another host published it):
    // as a lock the other host just let go, so that the client looks again and finds it.
    auto names = detail::s3_entry_names(*quick_, s3_key(o_.prefix, *rel));
    if (names && detail::files_named(*rel, *names).done()) {
      lease->use(*s3_);
      (void)lease->release();
      looks_.forget(*rel);
      // An LNL rank that holds its key's flock is shown no product the entry lacks here
      // (entry_view.hpp): it must find the entry whole when it looks again, so it is
      // fetched now, once for the host's ranks (which wait in their flock meanwhile).
      if (EntryFiles::of_entry_path(*rel).is_lnl() && fill_entry(*rel))
        (void)looks_.single_flight("fetch " + *rel, [&] {
          return local_done(entry_dir) ||
                 is_success(
                     fetch(entry_dir, s3_key(o_.prefix, *rel), detail::files_named(*rel, *names), has_record(*names))
                         .outcome);
        });
      return {ClientHold::done, fmt::format("{}: done in the bucket", s3_->describe(key))};
    }
    // (Taken within the bound; kept, renewed and given back with the full client's retries:
    // a renewal that timed out under load must not let the lease lapse for other hosts.)
    lease->use(*s3_);
    stand_ins_.put(entry_dir, detail::StandIns::Held(std::move(*lease)));
    return {ClientHold::taken};
  }
  if (lease.error().code == Errc::busy) return note_answered(), ClientHold{ClientHold::elsewhere, lease.error().message};
  note_unanswered(lease.error());
  return {ClientHold::here_only, lease.error().message};
}

NEFFCACHE_DECL bool S3Tier::failed_under_hold(const std::string& entry_dir) const {
  auto since = stand_ins_.since(entry_dir);
  struct stat st {};
  if (!since || ::stat(failure_record(entry_dir).c_str(), &st) != 0) return false;
  // (Whole seconds: a record written in the second the hold began counts.)
  return std::chrono::system_clock::from_time_t(st.st_mtim.tv_sec) + std::chrono::seconds(1) >= *since;
}

NEFFCACHE_DECL bool S3Tier::unanswered() {
  const auto now = std::chrono::steady_clock::now();
  if (now.time_since_epoch().count() >= unanswered_until_.load()) return false;
  // (The one question of this probe interval goes to S3.)
  auto probe = unanswered_probe_.load();
  return !(now.time_since_epoch().count() >= probe &&
           unanswered_probe_.compare_exchange_strong(probe, (now + k_unanswered_probe).time_since_epoch().count()));
}

NEFFCACHE_DECL void S3Tier::note_unanswered(const Error& e) {
  // (S3's own answers, a missing object or a lost condition, are answers.)
  if (e.code != Errc::io && e.code != Errc::timed_out) return;
  const auto now = std::chrono::steady_clock::now();
  unanswered_probe_ = (now + k_unanswered_probe).time_since_epoch().count();
  unanswered_until_ = (now + k_unanswered_pause).time_since_epoch().count();
}

NEFFCACHE_DECL Result<void> S3Tier::upload_written(const std::string& entry_dir) {
  if (o_.read_only) return {};
  auto rel = entry_path_in(o_.root, entry_dir);
  if (!rel)
    return Error{Errc::invalid_argument, fmt::format("{} is not an entry of the local tier {}", entry_dir, o_.root)};
  auto here = read_entry_files(entry_dir);
  if (!here) {
    // (An LNL rank let go of its key before it made the key's folder, and no other rank
    // of this host took the key's lock since.)
    if (here.error().code == Errc::not_found && !entry_locked(entry_dir, EntryFiles::of_entry_path(*rel)))
      give_back(entry_dir);
    return here.error();
  }
  if (!here->done()) {
    if (entry_locked(entry_dir, *here)) return {};
    // The client let go without a NEFF: its graph goes up, then its lease, so that a host
    // waiting for the lease finds what to compile. Its compile's failure (model.log, which
    // libneuronxla writes for any failure) goes up as the entry's failure record under the
    // lease, unless the bucket has the entry done or failed: a host waiting for the lease
    // then finds the failure, as in a folder both hosts share, and compiles nothing.
    Result<void> r;
    if (here->has_hlo()) {
      const std::string base = s3_key(o_.prefix, *rel);
      auto names = detail::s3_entry_names(*s3_, base);
      const EntryFiles remote = names ? detail::files_named(*rel, *names) : EntryFiles{};
      if (!names) r = names.error();
      else if (auto up = upload_missing_inputs(entry_dir, *rel, remote); !up) r = up.error();
      else if (here->failed() && !remote.done() && !remote.failed() && failed_under_hold(entry_dir))
        if (auto log = s3_->upload(fmt::format("{}/{}", base, remote.failure_name()), failure_record(entry_dir)); !log)
          r = log.error();
    }
    // (Unless a client took the lock again meanwhile: the lease is its own then.)
    if (auto again = read_entry_files(entry_dir); again && entry_locked(entry_dir, *again)) return r;
    if (auto lease = end_stand_in(entry_dir)) (void)lease->release();
    return r;
  }
  CompileResult r = publish_here(entry_dir, *rel, end_stand_in(entry_dir));
  if (r.outcome == CompileOutcome::transient) return Error{Errc::io, r.message};
  return {};
}

NEFFCACHE_DECL CompileResult S3Tier::settle(const std::string& entry_dir, const CompileSettings& s) {
  auto rel = entry_path_in(o_.root, entry_dir);
  if (!rel) return transient(fmt::format("{} is not an entry of the local tier {}", entry_dir, o_.root));
  const std::string base = s3_key(o_.prefix, *rel);
  auto farm_busy = [&] {
    return CompileResult::of(CompileOutcome::busy,
                             fmt::format("{}: waiting for a compile farm to publish it", s3_->describe(base)));
  };
  if (o_.wait_for_farm && !local_done(entry_dir) && farm_looked_recently(entry_dir)) return farm_busy();
  // While we stand in for a client (stand_in), a look that fails keeps the job: its
  // looks are what renew the lease, so it must not end before the client lets go.
  auto failed_look = [&](std::string why) {
    return stand_ins_.holds(entry_dir) ? CompileResult::of(CompileOutcome::busy, std::move(why)) : transient(std::move(why));
  };
  auto names = detail::s3_entry_names(*s3_, base);
  if (!names) return failed_look(names.error().message);
  EntryFiles remote = detail::files_named(*rel, *names);
  // A client of this host that compiles the entry itself (a just-in-time client, whose
  // compiler runs outside the mount) holds its lock here: we stand in for it on S3
  // (stand_in) and look again later, so that no host compiles the graph a second time.
  // Once the client is done its NEFF goes to S3 for every host. Held by us, the lock
  // keeps this host's clients waiting for our compile instead of running their own.
  std::optional<EntryLock> here_lock;
  if (!o_.read_only && !remote.done()) {
    auto here = read_entry_files(entry_dir);
    if (!here) return failed_look(here.error().message);
    auto lock = EntryLock::try_acquire_entry(entry_dir, *here, s.lock);
    if (!lock && lock.error().code == Errc::busy)
      return stand_in(entry_dir, *rel, remote, *here, lock.error().message);
    if (!lock) return failed_look(lock.error().message);
    here_lock.emplace(std::move(*lock));
  }
  std::optional<S3Lease> client_lease = end_stand_in(entry_dir);
  if (here_lock) {
    auto here = read_entry_files(entry_dir);
    if (here && here->done()) return publish_here(entry_dir, *rel, std::move(client_lease));
    // A failure recorded here (a client's compile, or one of the bucket's taken here): its
    // record answers, as a directory cache's does, unless failures are retried.
    if (here && here->failed() && !s.retry_failed) {
      if (client_lease) (void)client_lease->release();
      return CompileResult::of(CompileOutcome::failed_cached,
                               fmt::format("{}: a failed compile is recorded ({})", entry_dir, failure_record(entry_dir)));
    }
  }
  if (client_lease) (void)client_lease->release();  // the client gave up: compiled below, under the lease again
  if (!o_.read_only) {
    auto uploaded = upload_missing_inputs(entry_dir, *rel, remote);
    if (!uploaded) return transient(uploaded.error().message);
    if (*uploaded) remote.add(EntryFile::hlo_module);
  }
  if (remote.done()) {
    if (o_.wait_for_farm) {
      std::lock_guard lk(farm_mu_);
      farm_looks_.erase(entry_dir);  // (waited for no more)
    }
    if (local_done(entry_dir)) return CompileResult::of(CompileOutcome::already_done, "");
    return fetch(entry_dir, base, remote, has_record(*names));
  }
  if (remote.failed() && !s.retry_failed) {
    take_failure(*s3_, entry_dir, base, remote);
    return CompileResult::of(CompileOutcome::failed_cached, fmt::format("{}: a failed compile is recorded ({})",
                                                                    s3_->describe(base), remote.failure_name()));
  }
  if (o_.wait_for_farm) return farm_busy();  // (its inputs are up: a farm's next listing takes it)
  auto slot = slots_.take(s.cancelled);
  if (!slot) return transient("cancelled");
  if (o_.read_only) {  // compiled here, as a directory cache's entry, and kept here
    // The NKI kernels its graph calls come from the bucket when this host lacks them
    // (reads only), as for a compile under a lease.
    if (auto here = read_entry_files(entry_dir); here && here->hlo_name())
      if (auto called = kernels_called(fmt::format("{}/{}", entry_dir, *here->hlo_name())))
        if (auto fetched = fetch_nki_kernels(*s3_, o_.prefix, o_.compile.nki_kernels, *called); !fetched)
          return transient(fetched.error().message);
    return compile_entry(entry_dir, s);
  }
  CompileSettings local = s;
  local.workdir_root = staging();
  S3CompileOptions co = o_.compile;
  co.published = [&](const std::string& staged) { take_staged(entry_dir, staged); };
  CompileResult r = compile_s3_entry(*s3_, o_.prefix, *rel, local, co);
  slot.reset();  // (a fetch takes none)
  // Its failure, recorded on S3, shows here as a folder's entry would show it.
  if (r.outcome == CompileOutcome::failed || r.outcome == CompileOutcome::failed_cached)
    if (auto after = detail::s3_entry_names(*s3_, base))
      take_failure(*s3_, entry_dir, base, detail::files_named(*rel, *after));
  // Another host finished it while we waited for the lease, or the bucket's twin served
  // it: fetch its NEFF (or link this host's copy of the twin).
  if (is_success(r.outcome) && !local_done(entry_dir)) {
    CompileResult f = fetch(entry_dir, base, remote, !r.twin.empty());
    if (!is_success(f.outcome)) return f;
  }
  return r;
}

NEFFCACHE_DECL Result<void> S3Tier::promote(const std::string& folder, const std::string& key) {
  if (!is_lnl_key(key)) return Error{Errc::invalid_argument, fmt::format("{}: not an LNL key", key)};
  if (o_.read_only) return {};
  auto names = publishable_files(folder);
  if (!names) return names.error();
  const std::string base = s3_key(o_.prefix, key);
  auto lease = S3Lease::acquire(*s3_, fmt::format("{}/{}", base, k_lnl_lease_file), o_.compile.lease_ttl,
                                o_.compile.host);
  if (!lease && lease.error().code == Errc::busy) return looks_.forget(key), Error{Errc::exists, lease.error().message};
  if (!lease) return lease.error();
  // (Settled whatever happens: the entry is up, was there already, or is as before.)
  auto hand_back = [&] { lease->finish(S3Lease::Entry::settled); };
  auto there = detail::s3_entry_names(*s3_, base);
  if (!there) return hand_back(), there.error();
  if (const EntryFiles remote = detail::files_named(key, *there); remote.has_hlo() || remote.has(EntryFile::done)) {
    hand_back();
    looks_.forget(key);
    return Error{Errc::exists, fmt::format("{}: the entry exists already", s3_->describe(base))};
  }
  // The kernels its graph calls go first: a host that sees the entry can compile it.
  Result<void> r = upload_kernels(fmt::format("{}/{}", folder, k_lnl_hlo_file));
  std::vector<std::string> uploaded;
  for (const auto& name : *names) {
    if (!r) break;
    if (auto renewed = lease->renew(); !renewed) {
      r = renewed.error();
      break;
    }
    auto up = s3_->upload(fmt::format("{}/{}", base, name), fmt::format("{}/{}", folder, name),
                          {.if_absent = name == k_lnl_marker_file});
    if (!up) {
      r = up.error().code == Errc::precondition_failed ? Error{Errc::exists, up.error().message} : up.error();
      break;
    }
    uploaded.push_back(name);
    ++counters_.uploads;
  }
  if (!r)
    for (const auto& name : uploaded) (void)s3_->remove(fmt::format("{}/{}", base, name));
  hand_back();
  // Taken: the next look at the key asks S3 again, and finds the entry there.
  if (!r && r.error().code == Errc::exists) looks_.forget(key);
  if (r) {
    struct stat st {};
    if (::stat(fmt::format("{}/{}", folder, lnl_neff_name(key)).c_str(), &st) == 0)
      keep(fmt::format("{}/{}", o_.root, key), static_cast<uint64_t>(st.st_size));
  }
  return r;
}

NEFFCACHE_DECL nlohmann::ordered_json S3Tier::stats() const {
  return {{"fetches", counters_.fetches.load()},   {"fetched_bytes", counters_.fetched_bytes.load()},
          {"uploads", counters_.uploads.load()},   {"published", counters_.published.load()},
          {"lookups", counters_.lookups.load()},
          {"evictions", counters_.evictions.load()}, {"local_neff_bytes", kept_.bytes()},
          {"local_cap_bytes", o_.cap_bytes},         {"read_only", o_.read_only},
          {"requests", s3_->requests()},             {"request_errors", s3_->request_errors()},
          {"retries", s3_->retries()}};
}

NEFFCACHE_DECL Result<uint64_t> S3Tier::warm(const std::string& rel) {
  if (!is_entry_path(rel)) return Error{Errc::invalid_argument, fmt::format("{}: not an entry path", rel)};
  const std::string dir = fmt::format("{}/{}", o_.root, rel);
  if (local_done(dir)) return uint64_t{0};
  const std::string base = s3_key(o_.prefix, rel);
  auto names = detail::s3_entry_names(*s3_, base);
  if (!names) return names.error();
  const EntryFiles remote = detail::files_named(rel, *names);
  if (!remote.done()) return Error{Errc::not_found, fmt::format("{}: not done in the bucket", s3_->describe(base))};
  Staged s{dir, fmt::format("{}/warm-{}", staging(), detail::random_hex64()), {}, 0};
  if (!make_dir(s.staged)) return sys_error("create", s.staged);
  detail::RemovedTree staged(s.staged);  // (until it is warming_'s)
  // As fetch_inputs and fetch would bring them: the inputs (LNL's text files too), the
  // flags before the HLO; then the NEFF, LNL's log, the marker.
  if (remote.is_lnl())
    for (std::string_view text : {k_lnl_fxgraph_file, k_lnl_example_inputs_file})
      if (std::find(names->begin(), names->end(), text) != names->end()) s.names.emplace_back(text);
  for (auto& name : detail::input_names(remote)) s.names.push_back(std::move(name));
  s.names.push_back(remote.neff_name());
  if (remote.is_lnl() && remote.has(EntryFile::compiler_log)) s.names.emplace_back(k_lnl_log_file);
  s.names.emplace_back(remote.done_name());
  for (const auto& name : s.names) {
    const std::string to = fmt::format("{}/{}", s.staged, name);
    if (!remote.is_lnl() && name == k_done_file) {  // (ours: empty)
      detail::UniqueFd made(sys::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
      if (!made) return sys_error("create", to);
      continue;
    }
    if (::access(fmt::format("{}/{}", dir, name).c_str(), F_OK) == 0 && name != remote.neff_name() &&
        name != remote.done_name())
      continue;  // an input here already
    auto got = s3_->download(fmt::format("{}/{}", base, name), to, {}, S3Client::FileSync::later);
    if (!got) return got.error();
    if (name == remote.neff_name()) s.neff_bytes = got->size;
  }
  const uint64_t bytes = s.neff_bytes;
  staged.dir.clear();
  std::lock_guard lk(warm_mu_);
  warming_.push_back(std::move(s));
  return bytes;
}

NEFFCACHE_DECL Result<std::size_t> S3Tier::warmed() {
  std::vector<Staged> batch;
  {
    std::lock_guard lk(warm_mu_);
    batch.swap(warming_);
  }
  if (batch.empty()) return std::size_t{0};
  auto sync = [&]() -> Result<void> {
    detail::UniqueFd root(sys::open(o_.root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!root || sys::syncfs(root.get()) != 0) return sys_error("syncfs", o_.root);
    return {};
  };
  auto synced = sync();
  std::size_t placed = 0;
  for (const Staged& s : batch) {
    detail::RemovedTree staged(s.staged);
    if (!synced || local_done(s.dir)) continue;
    bool whole = make_dir(s.dir);
    for (const auto& name : s.names) {
      const std::string from = fmt::format("{}/{}", s.staged, name), to = fmt::format("{}/{}", s.dir, name);
      if (!whole || (::access(from.c_str(), F_OK) != 0 && ::access(to.c_str(), F_OK) == 0)) continue;  // (here)
      if (sys::rename(from.c_str(), to.c_str()) != 0) {
        whole = false;
        fmt::print(stderr, "neffcache: warning: {}\n", sys_error("rename", to).message);
      }
    }
    if (!whole) continue;
    ++placed;
    ++counters_.fetches;
    counters_.fetched_bytes += s.neff_bytes;
    keep(s.dir, s.neff_bytes);
  }
  if (!synced) return synced.error();
  if (auto again = sync(); !again) return again.error();
  return placed;
}

NEFFCACHE_DECL std::optional<std::string> S3Tier::relative(const std::string& path) const {
  if (path == o_.root) return std::string();
  if (!path.starts_with(o_.root) || path.size() <= o_.root.size() + 1 || path[o_.root.size()] != '/')
    return std::nullopt;
  std::string rel = path.substr(o_.root.size() + 1);
  if (rel.starts_with(k_private_prefix)) return std::nullopt;
  return rel;
}

NEFFCACHE_DECL bool S3Tier::make_dir(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  return !ec;
}

}  // namespace neffcache
