// Definitions of compile/pipeline.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/pipeline.hpp>

#include <algorithm>
#include <filesystem>
#include <optional>
#include <thread>

#include <fmt/format.h>

#include <neffcache/compile/publish.hpp>

namespace neffcache {

NEFFCACHE_DECL Result<EntryFiles> FolderEntry::files() const { return read_entry_files(dir_); }

NEFFCACHE_DECL Result<std::unique_ptr<EntryHold>> FolderEntry::take(const EntryFiles& files) {
  auto lock = EntryLock::try_acquire_entry(dir_, files, lock_);
  if (!lock) return lock.error();
  remove_publish_leftovers(dir_);
  return std::unique_ptr<EntryHold>(std::make_unique<LockHold>(std::move(*lock), lock_.heartbeat_interval()));
}

NEFFCACHE_DECL Result<std::string> FolderEntry::publish(const EntryFiles& files, const Produced& p) {
  return detail::publish(dir_, p.neff, p.meta, owner_, files, p.compiler_log);
}

NEFFCACHE_DECL Result<void> FolderEntry::record_failure(const EntryFiles& files, const std::string& log) {
  sys::unlink(fmt::format("{}/{}", dir_, files.neff_name()).c_str());
  const OwnFiles own = own_files(dir_);
  if (auto m = own.make(); !m) return m;
  if (sys::rename(log.c_str(), own.failure.c_str()) != 0) return sys_error("record failure in", own.dir);
  detail::fsync_dir(own.dir);
  return {};
}

NEFFCACHE_DECL Result<void> FolderEntry::make() {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return Error{Errc::io, fmt::format("cannot create {}: {}", dir_, ec.message())};
  return {};
}

NEFFCACHE_DECL CompileResult compile_held(Destination& d, const HeldCompile& how, const RunStep& run) {
  auto transient = [](std::string why) { return CompileResult::of(CompileOutcome::transient, std::move(why)); };
  auto files = d.files();
  if (!files) return transient(files.error().message);
  if (auto r = how.look(*files, false)) return *r;
  std::unique_ptr<EntryHold> hold;
  for (;;) {
    auto taken = d.take(*files);
    if (taken) {
      hold = std::move(*taken);
      break;
    }
    if (taken.error().code != Errc::busy) return transient(taken.error().message);
    if (!how.wait_until) return CompileResult::of(CompileOutcome::busy, taken.error().message);
    const auto now = std::chrono::steady_clock::now();
    if (now >= *how.wait_until)
      return CompileResult::of(CompileOutcome::busy, fmt::format("gave up waiting: {}", taken.error().message));
    std::this_thread::sleep_for(
        std::min<std::chrono::steady_clock::duration>(std::max(d.poll_interval(), how.min_poll), *how.wait_until - now));
    files = d.files();
    if (!files) return transient(files.error().message);
    if (auto r = how.look(*files, false)) return *r;
  }
  // Kept alive from here until it is given back, whatever step the compile is in.
  std::optional<KeepAlive> alive(std::in_place, *hold);
  auto give_back = [&](CompileResult r) {
    alive.reset();
    hold->finish(is_success(r.outcome));
    return r;
  };
  // Whoever held it before may have finished it.
  files = d.files();
  if (!files) return give_back(transient(files.error().message));
  if (auto r = how.look(*files, true)) return give_back(std::move(*r));

  Ran ran = run(*files, *hold);
  CompileResult& r = ran.result;
  // (What the run counted, attempts and times, stays in its result whatever ends it.)
  auto stop = [&](std::string why) {
    r.outcome = CompileOutcome::transient;
    r.message = std::move(why);
    r.oom_killed = false;
    return give_back(std::move(r));
  };
  // Taken over while we ran: final here, whatever ended the run.
  if (hold->lost()) return stop(hold->lost_why());
  const bool publish = r.outcome == CompileOutcome::success;
  if (!publish && (r.outcome != CompileOutcome::failed || ran.failure_log.empty())) return give_back(std::move(r));
  // Whatever goes in goes only while the hold is surely ours.
  if (auto held = alive->beat_now(); !held) return stop(hold->lost() ? hold->lost_why() : held.error().message);
  if (publish) {
    auto where = d.publish(*files, ran.produced);
    if (!where) return stop(where.error().message);
    if (ran.produced.on_published) ran.produced.on_published(*where);
    r.message.clear();
  } else if (auto recorded = d.record_failure(*files, ran.failure_log); !recorded) {
    return stop(recorded.error().message);
  } else if (ran.on_failure_recorded) {
    ran.on_failure_recorded();
  }
  return give_back(std::move(r));
}

}  // namespace neffcache
