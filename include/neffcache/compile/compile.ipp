// Definitions of compile/compile.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/compile.hpp>

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::string read_tail(int fd, off_t from, std::size_t max) {
  struct stat st {};
  if (::fstat(fd, &st) != 0 || st.st_size <= from) return {};
  off_t at = std::max<off_t>(from, st.st_size - static_cast<off_t>(max));
  std::string out(static_cast<std::size_t>(st.st_size - at), '\0');
  ssize_t n = sys::pread(fd, out.data(), out.size(), at);
  out.resize(n > 0 ? static_cast<std::size_t>(n) : 0);
  return out;
}

NEFFCACHE_DECL void log_line(int fd, std::string_view line) {
  (void)write_all(fd, fmt::format("neffcache: {}\n", line), "log");
}
}  // namespace detail

NEFFCACHE_DECL std::optional<CompileOutcome> folder_settled(const std::string& entry_dir, const CompileSettings& s) {
  auto files = read_entry_files(entry_dir);
  if (!files) return std::nullopt;
  return settled_outcome(*files, s.retry_failed);
}

NEFFCACHE_DECL CompileResult& refused(CompileResult& r, std::string_view entry, const CompileSettings& s) {
  r.outcome = CompileOutcome::transient;
  r.refused = true;
  r.message = fmt::format("{}: not compiled: {}", entry, s.compiles_off);
  return r;
}

NEFFCACHE_DECL CompileResult compile_entry(const std::string& entry_dir, const CompileSettings& s) {
  using namespace std::chrono;
  auto transient = [](std::string why) { return CompileResult::of(CompileOutcome::transient, std::move(why)); };
  HeldCompile how;
  how.look = [&](const EntryFiles& files, bool held) -> std::optional<CompileResult> {
    if (auto o = settled_outcome(files, s.retry_failed)) return CompileResult::of(*o);
    // Our own publish, interrupted after its NEFF went in place: finished under the hold
    // (compiles off or not), not compiled again. A NEFF whose bytes are not the recorded
    // ones is a leftover: the checks below decide whether it compiles.
    if (publish_interrupted(entry_dir, files)) {
      if (!held) return std::nullopt;
      const auto owner = files.hlo_name() ? detail::entry_owner(fmt::format("{}/{}", entry_dir, *files.hlo_name()))
                                          : std::nullopt;
      if (auto finished = finish_publish(entry_dir, files, owner); finished && *finished)
        return CompileResult::of(CompileOutcome::already_done);
    } else if (held) {
      return std::nullopt;
    }
    if (!files.has_job())
      return transient(fmt::format("{}: {}", entry_dir,
                                   files.is_lnl() ? "no graph.hlo with LNL's metadata: its client compiles it"
                                                  : "no HLO file to compile"));
    CompileResult r;
    if (!s.compiles_off.empty()) return refused(r, entry_dir, s);
    // Never a NEFF of another compiler than the one its folder names.
    if (auto serves = compiler_serves(entry_dir, s); !serves) {
      r = transient(serves.error().message);
      r.refused = true;
      return r;
    }
    return std::nullopt;
  };

  FolderEntry entry(entry_dir, s.lock);
  const OwnFiles own = own_files(entry_dir);
  const std::string& log_path = own.compile_log;
  detail::UniqueFd log;  // (outlives the run: the publish is logged too)
  std::optional<detail::RemovedTree> workdir;  // the last attempt's, whose NEFF is published

  return compile_held(entry, how, [&](const EntryFiles& files, EntryHold& hold) -> Ran {
    Ran out;
    CompileResult& r = out.result;
    auto stop = [&](std::string why) {
      r.outcome = CompileOutcome::transient;
      r.message = std::move(why);
      return std::move(out);
    };
    const std::string hlo_path = fmt::format("{}/{}", entry_dir, *files.hlo_name());
    const std::string key = detail::entry_name(entry_dir);
    const auto owner = detail::entry_owner(hlo_path);
    entry.set_owner(owner);
    // Never through a link: in a user's entry it could name any file, which root would truncate.
    if (auto m = own.make(); !m) return stop(m.error().message);
    log = detail::UniqueFd(sys::open(log_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644));
    if (!log) return stop(sys_error("create", log_path).message);
    detail::give(log.get(), owner);
    // A deterministic failure: the log, fully written, becomes the entry's model.log.
    auto fail = [&](std::string why) {
      detail::log_line(log.get(), why);
      r.outcome = CompileOutcome::failed;
      r.message = std::move(why);
      out.failure_log = log_path;
      return std::move(out);
    };

    // Bad contents are the entry's fault; a failed read is not, and may pass. LNL's
    // command.txt is never judged so: a rank creates it empty, then writes it, and of an
    // LNL entry only the compiler's own failure is recorded.
    // An LNL entry compiles with its own command's arguments (when it has command.txt).
    auto command = entry_command(entry_dir, files, s.default_flags);
    if (!command && (command.error().code == Errc::io || files.is_lnl())) return stop(command.error().message);
    if (!command) return fail(command.error().message);
    std::vector<std::string> flags = std::move(command->flags);
    std::optional<LnlCommand> lnl_command = std::move(command->lnl);
    // An NKI kernel the graph calls by path must be on this host, else the compiler fails
    // (NCC_EVRF059): not the graph's fault, so refused now and never recorded. An HLO we
    // cannot read is left to the compiler to judge.
    if (auto hlo = analyze_hlo_file(hlo_path))
      for (const auto& kernel : hlo->stats.kernel_files)
        if (::access(kernel.c_str(), F_OK) != 0)
          return stop(fmt::format("{}: the graph calls the NKI kernel {}, which is not on this host", entry_dir, kernel));
    // A retried failure: the old record goes only once we really compile again.
    sys::unlink(own.failure.c_str());

    std::string root = s.workdir_root;
    if (root.empty()) root = detail::getenv_or("TMPDIR", "/tmp");
    PosixRunner posix;
    ProcessRunner& runner = s.runner ? *s.runner : posix;
    const std::string hlo_suffix(files.is_lnl() ? "" : files.hlo_name()->substr(std::string_view("model").size()));

    for (int attempt = 0; attempt <= s.max_retries; ++attempt) {
      std::string tmpl = fmt::format("{}/neffcache-{}-XXXXXX", root, key.substr(0, 64));
      workdir.reset();
      if (!sys::mkdtemp(tmpl.data())) return stop(sys_error("create work directory in", root).message);
      workdir.emplace().dir = tmpl;
      const std::string& dir = workdir->dir;
      CompilerTemplate::Values v{fmt::format("{}/model.{}{}", dir, key, hlo_suffix),
                                 fmt::format("{}/model.{}.neff", dir, key), dir, key, flags};
      // The compiler's own log (LNL keeps it): where --logfile names it, or where
      // neuronx-cc writes it by default, in its working folder.
      const std::string compiler_log = fmt::format("{}/{}", dir, k_lnl_log_file);
      if (files.is_lnl())
        v.hlo = fmt::format("{}/{}", dir, k_lnl_hlo_file), v.neff = fmt::format("{}/{}", dir, files.neff_name());
      if (auto c = detail::copy_file_hashed(hlo_path, v.hlo, 0644); !c)
        return c.error().code == Errc::invalid_argument ? fail(c.error().message) : stop(c.error().message);
      // A compiler run as another user writes into a work folder of its own. (What it
      // leaves there is read without following links: see open_regular.)
      if (s.run_as && ::chown(dir.c_str(), s.run_as->uid, s.run_as->gid) != 0)
        return stop(sys_error("give the work directory to", s.run_as->name).message);

      RunSpec spec;
      spec.argv = lnl_command ? lnl_compile_argv(s.compiler.program(), *lnl_command, v.hlo, v.neff, compiler_log)
                              : s.compiler.expand(v);
      spec.cwd = dir;
      spec.log_fd = log.get();
      spec.timeout = s.timeout;
      spec.kill_grace = s.kill_grace;
      // Should we die, the entry stays locked until the compiler is gone too.
      spec.inherit_fd = hold.descriptor();
      spec.run_as = s.run_as;
      // Ticks often enough to notice a cancel or a lost lock (KeepAlive beats it) quickly.
      spec.tick_interval = std::min<milliseconds>(s.lock.heartbeat_interval(), milliseconds(250));
      std::string stop_reason;
      spec.tick = [&] {
        if (hold.lost()) return stop_reason = hold.lost_why(), false;
        if (s.cancelled && s.cancelled()) return stop_reason = "cancelled", false;
        return true;
      };
      std::string command;
      for (const auto& a : spec.argv) command += (command.empty() ? "" : " ") + a;
      detail::log_line(log.get(), fmt::format("attempt {} in {}: {}", attempt + 1, dir, command));

      const off_t output_from = ::lseek(log.get(), 0, SEEK_END);
      auto run = runner.run(spec);
      ++r.attempts;
      if (!run) return stop(run.error().message);  // e.g. compiler not on PATH
      r.compile_seconds = duration<double>(run->wall).count();
      r.peak_rss_kib = std::max(r.peak_rss_kib, run->peak_rss_kib);

      // Killed for lack of memory: the kernel's SIGKILL (our own timeout and cancel kills are
      // RunEnd::timed_out and cancelled), 128+9 from a shell or launcher whose child it
      // killed, or neuronx-cc's own report. Not the graph's fault, so nothing is recorded;
      // and a retry here, with as much memory as before, would be killed again: handed back
      // at once, for a caller that can give it more (max_retries is not used).
      std::string oom;
      if (run->end == RunEnd::signaled && run->signal == SIGKILL) oom = "signal 9";
      else if (run->end == RunEnd::exited && run->exit_code == 128 + SIGKILL) oom = "exit 137";
      else if (run->end == RunEnd::exited && run->exit_code == detail::k_neuron_internal_error_exit &&
               detail::neuron_reports_oom(detail::read_tail(log.get(), output_from, 64 << 10)))
        oom = fmt::format("exit {}, {}", run->exit_code, detail::k_neuron_oom_mark);
      if (!oom.empty()) {
        r.oom_killed = true;
        r.peak_rss_kib = run->peak_rss_kib;
        const std::string why = fmt::format("compiler killed for lack of memory ({}) at a peak of {} MiB", oom,
                                            (run->peak_rss_kib + 512) / 1024);
        detail::log_line(log.get(), why + " (transient: nothing recorded)");
        return stop(why);
      }

      std::string why;
      switch (run->end) {
        case RunEnd::exited:
          if (run->exit_code != 0) {
            auto exhausted = detail::resource_exhaustion(detail::read_tail(log.get(), output_from, 64 << 10));
            if (!exhausted) return fail(fmt::format("compiler exited with status {}", run->exit_code));
            why = fmt::format("compiler exited with status {} and printed '{}'", run->exit_code, *exhausted);
          }
          else if (!std::filesystem::exists(v.neff)) return fail("compiler exited 0 but wrote no NEFF");
          break;
        case RunEnd::signaled:
          why = fmt::format("compiler killed by signal {}", run->signal);
          break;
        case RunEnd::timed_out:
          why = fmt::format("compiler timed out after {} s", duration_cast<seconds>(s.timeout).count());
          break;
        case RunEnd::cancelled:
          why = fmt::format("compile stopped: {}", stop_reason);
          break;
      }
      if (!why.empty()) {
        detail::log_line(log.get(), why + " (transient: nothing recorded)");
        r.message = why;
        // A lost lock or a cancel is final; the other transients may be retried.
        if (run->end == RunEnd::cancelled) break;
        continue;
      }

      nlohmann::ordered_json meta{{"compiler", spec.argv},
                                  {"flags", flags},
                                  {"compile_seconds", r.compile_seconds},
                                  {"peak_rss_kib", r.peak_rss_kib},
                                  {"predicted_peak_kib", s.predicted_peak_kib},
                                  {"oom_retries", s.oom_retries},
                                  {"attempts", r.attempts},
                                  {"host", detail::current_process().host}};
      // An LNL entry has no compiler folder: its result's identity names this version.
      if (files.is_lnl())
        if (auto version = compiler_version(s)) meta["compiler_version"] = *version;
      r.outcome = CompileOutcome::success;
      out.produced = {v.neff, std::move(meta), compiler_log, [&, seconds = r.compile_seconds](const std::string& at) {
                        detail::log_line(log.get(), fmt::format("published {} ({} bytes) in {:.2f} s", at,
                                                                std::filesystem::file_size(at), seconds));
                      }};
      return out;
    }
    r.outcome = CompileOutcome::transient;
    return out;
  });
}

}  // namespace neffcache
