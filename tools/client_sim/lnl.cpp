// neuron-client-sim: the LNL dialect (see main.cpp).
#include "client_sim/sim.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/env.hpp>
#include <neffcache/core/file.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/compile/runner.hpp>

namespace neffcache::clientsim {

// The LNL cache this process uses: $VLLM_CACHE_ROOT (vLLM Neuron), else
// $NEURON_LIBTORCH_CACHE_ROOT (TorchNeuron), else vLLM's default, each with
// neuron/compile_cache below it.
std::string lnl_cache_root() {
  std::string base;
  if (auto v = process_env("VLLM_CACHE_ROOT"); v && !v->empty()) base = *v;
  else if (auto t = process_env("NEURON_LIBTORCH_CACHE_ROOT"); t && !t->empty()) base = *t;
  else base = getenv_or("HOME", "/root") + "/.cache/vllm";
  return base + "/neuron/compile_cache";
}

namespace {

// Step 1's test, on a local or a remote entry: graph.hlo, the NEFF and the marker exist
// (stat), and a name .artifact_metadata_v*.json is in the folder's listing.
bool lnl_complete(const std::string& dir, const std::string& key) {
  if (!exists(dir + "/" + std::string(k_lnl_hlo_file)) || !exists(dir + "/" + lnl_neff_name(key)) ||
      !exists(dir + "/" + std::string(k_lnl_marker_file)))
    return false;
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(dir, ec)) {
    const std::string n = f.path().filename().string();
    if (n.starts_with(".artifact_metadata_v") && n.ends_with(".json")) return true;
  }
  return false;
}

// Copies the regular files of the entry `from` into the new folder `to`, but those named
// in `skip`.
Result<void> copy_entry(const std::string& from, const std::string& to, std::initializer_list<std::string_view> skip) {
  std::error_code ec;
  fs::create_directories(to, ec);
  if (ec) return sys_error("create", to, ec.value());
  for (const auto& f : fs::directory_iterator(from, ec)) {
    const std::string n = f.path().filename().string();
    if (!f.is_regular_file() || std::find(skip.begin(), skip.end(), n) != skip.end()) continue;
    if (auto c = detail::copy_file_hashed(f.path().string(), to + "/" + n, 0644); !c) return c.error();
  }
  if (ec) return sys_error("list", from, ec.value());
  return {};
}

// Step 6: the promoted entry `remote` copied to <root>/<key>.tmp.<pid> (without
// .cache_accessed), a leftover <root>/<key> renamed to <root>/<key>.trash.<pid>, the
// copy renamed into place, the trash removed. On an error the copy is removed and the
// caller compiles instead.
Result<void> fetch_lnl(const std::string& remote, const std::string& root, const std::string& key) {
  const std::string dir = root + "/" + key, tmp = fmt::format("{}.tmp.{}", dir, ::getpid()),
                    trash = fmt::format("{}.trash.{}", dir, ::getpid());
  std::error_code ec;
  auto failed = [&](Error e) {
    fs::remove_all(tmp, ec);
    return e;
  };
  fs::remove_all(tmp, ec);
  if (auto c = copy_entry(remote, tmp, {".cache_accessed"}); !c) return failed(c.error());
  if (exists(dir) && ::rename(dir.c_str(), trash.c_str()) != 0) return failed(sys_error("rename", dir));
  if (::rename(tmp.c_str(), dir.c_str()) != 0) return failed(sys_error("rename", tmp));
  fs::remove_all(trash, ec);
  return {};
}

// Step 7, save_cache(): the complete entry `dir` copied (without .cache_accessed) to
// <remote>/<key>.tmp.<host>.<pid> and renamed to <remote>/<key>. True when this call
// published it; false when the remote has the key already (before, or when the rename
// finds the name taken: EEXIST or ENOTEMPTY). The staging copy is removed after.
Result<bool> save_cache(const std::string& dir, const std::string& remote, const std::string& key) {
  if (!lnl_complete(dir, key)) return Error{Errc::invalid_argument, fmt::format("{}: not complete, not saved", dir)};
  const std::string target = remote + "/" + key;
  if (exists(target)) return false;
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string staging = fmt::format("{}.tmp.{}.{}", target, host, ::getpid());
  std::error_code ec;
  auto cleanup = [&] { fs::remove_all(staging, ec); };
  if (auto c = copy_entry(dir, staging, {".cache_accessed"}); !c) return cleanup(), c.error();
  if (::rename(staging.c_str(), target.c_str()) == 0) return true;
  const int err = errno;
  cleanup();
  if (err == EEXIST || err == ENOTEMPTY) return false;
  return sys_error("rename", staging, err);
}

// Writes a whole file as Python's open(path, "w").write(text) does: created or truncated,
// written, closed; no temporary name.
Result<void> write_plain(const std::string& path, std::string_view text) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd) return sys_error("open", path);
  return detail::write_all(fd.get(), text, path);
}

}  // namespace

// The first use of a graph, as libtorch_neuronx_lite runs it, step by step as
// ../shared/notes/lnl-cache-facts.md has them ("How a rank uses the cache"):
//  1. the hit check (lnl_complete); a hit writes .cache_accessed, checks the metadata's
//     cache_key and loads the NEFF;
//  2. the key's lock, <root>/.<key>.compilation_metadata.lock: open(O_RDWR|O_CREAT|O_TRUNC)
//     and flock(LOCK_EX|LOCK_NB); the holder file beside it;
//  3. before locking, a holder file naming a dead process (or one with another comm or
//     command line) is cleared: the entry's marker (when it exists), the holder, the lock;
//  4. the winner writes the holder file, looks again, tries the remote (6), else compiles
//     in the entry: graph.hlo, command.txt (created empty, then written), the compiler with
//     --output and --logfile there, then the metadata and the marker last;
//  5. the others read the holder file (10 tries 0.2 s apart), then look every --poll
//     seconds: complete, they load it; the holder dead, they clear it (3) and stop;
//     NEURON_LIBTORCH_COMPILATION_TIMEOUT (600 s) ends the wait;
//  8. a root on NFS or Lustre is refused.
// Every error is fatal to the process (the caller stops at the first failed graph).
//
// With --save-cache, a compile is then saved to the remote cache (save_cache): `saved`
// becomes "promoted" (this process published it) or "taken" (the remote had the key).
GraphResult load_lnl(const Graph& g, const Options& opts, const CompilerTemplate& tmpl,
                     const std::vector<std::string>& flags, const std::string& root, const std::string& key,
                     std::string& saved) {
  const auto t0 = SteadyClock::now();
  const std::string dir = root + "/" + key;
  const std::string neff = dir + "/" + lnl_neff_name(key), marker = dir + "/" + std::string(k_lnl_marker_file);
  const std::string lock_path = root + "/" + lnl_lock_name(key), holder_path = root + "/" + lnl_holder_name(key);
  auto result = [&](GraphResult r) {
    r.seconds = since(t0);
    return r;
  };
  auto fatal = [&](std::string why) { return result({Outcome::failed, 0, 0, std::move(why)}); };
  auto hit = [&](Outcome o) {
    (void)write_plain(dir + "/.cache_accessed", fmt::format("{}", std::time(nullptr)));  // (a failure is ignored)
    auto meta = read_file(dir + "/" + std::string(k_lnl_metadata_file));
    if (!meta) return fatal(meta.error().message);
    auto j = nlohmann::json::parse(*meta, nullptr, false);
    if (j.is_discarded() || !j.is_object() || j.value("cache_key", std::string()) != key)
      return fatal(fmt::format("{}: the metadata's cache_key is not {}", dir, key));
    auto n = read_neff(neff, g);
    if (!n) return fatal(n.error().message);
    fmt::print(stderr, "INFO: loaded the cached NEFF {}\n", neff);
    return result({o, 0, *n, {}});
  };
  // Step 3's and step 5's removal of a dead holder's files (a marker that exists() saw,
  // whose removal must then work, as os.remove's must).
  auto clear_dead_holder = [&]() -> Result<void> {
    if (exists(marker) && ::unlink(marker.c_str()) != 0) return sys_error("remove", marker);
    ::unlink(holder_path.c_str());
    ::unlink(lock_path.c_str());
    return {};
  };

  if (lnl_complete(dir, key)) return hit(Outcome::hit);
  std::error_code ec;
  fs::create_directories(root, ec);
  struct statfs sf {};
  if (::statfs(root.c_str(), &sf) == 0 && (sf.f_type == 0x6969 || sf.f_type == 0x0bd00bd0))
    return fatal(fmt::format("{}: the compile cache must not be on NFS or Lustre", root));
  if (auto text = read_file(holder_path)) {
    if (auto h = parse_lnl_holder(*text); h && !lnl_holder_alive(*h))
      if (auto c = clear_dead_holder(); !c) return fatal(c.error().message);
  }
  UniqueFd lock(::open(lock_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!lock) return fatal(sys_error("open", lock_path).message);
  if (::flock(lock.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) return fatal(sys_error("lock", lock_path).message);
    // Step 5: someone compiles the key.
    std::optional<LnlHolder> holder;
    for (int i = 0; i < 10 && !holder; ++i) {
      if (auto text = read_file(holder_path)) holder = parse_lnl_holder(*text);
      if (!holder) sleep_for(0.2);
    }
    if (!holder) return fatal(fmt::format("{}: no holder named while the lock is taken", holder_path));
    const double timeout = std::stod(process_env("NEURON_LIBTORCH_COMPILATION_TIMEOUT").value_or("600"));
    const auto waiting_since = SteadyClock::now();
    for (;;) {
      if (lnl_complete(dir, key)) return hit(Outcome::waited);
      if (!lnl_holder_alive(*holder)) {
        (void)clear_dead_holder();
        return fatal("Lock holder process died - cache invalidated, please retry compilation");
      }
      if (since(waiting_since) > timeout)
        return fatal(fmt::format("timed out after {:.0f} s waiting for the compile of {}", timeout, key));
      sleep_for(opts.poll_seconds);
    }
  }
  // Step 4: ours.
  if (auto w = write_plain(holder_path, lnl_holder_record()); !w) return fatal(w.error().message);
  if (lnl_complete(dir, key)) return hit(Outcome::hit);
  if (auto remote = process_env("NEURON_LIBTORCH_REMOTE_CACHE"); remote && !remote->empty()) {
    const std::string promoted = *remote + "/" + key;
    if (lnl_complete(promoted, key)) {
      if (auto f = fetch_lnl(promoted, root, key); f) return hit(Outcome::fetched);
      else fmt::print(stderr, "WARNING: fetching {} failed ({}); compiling instead\n", key, f.error().message);
    }
  }
  if (process_env("VLLM_NEURON_DISABLE_WARMUP_COMPILE") == "1")
    return fatal(fmt::format("{} is not in the cache and VLLM_NEURON_DISABLE_WARMUP_COMPILE=1 forbids compiling", key));
  fmt::print(stderr, "INFO: compiling {}\n", key);
  // The compiler by its absolute path, as LNL runs it.
  std::string program = tmpl.program();
  if (auto found = resolve_program(program)) program = fs::absolute(*found).string();
  std::string command = fmt::format("{0} compile {1}/graph.hlo --framework XLA --target {2} --output {3} "
                                    "--logfile {1}/{4}",
                                    program, dir, opts.target, neff, k_lnl_log_file);
  for (const auto& f : flags) command += " " + f;
  fs::create_directories(dir, ec);
  const std::string command_path = dir + "/" + std::string(k_lnl_command_file);
  if (auto w = write_plain(dir + "/" + std::string(k_lnl_hlo_file), g.bytes); !w) return fatal(w.error().message);
  if (auto w = write_plain(command_path, ""); !w) return fatal(w.error().message);
  if (auto w = write_plain(command_path, command + "\n"); !w) return fatal(w.error().message);
  auto parsed = parse_lnl_command(command);
  if (!parsed) return fatal(parsed.error().message);
  RunSpec spec;
  spec.argv = lnl_compile_argv(tmpl.program(), *parsed, dir + "/" + std::string(k_lnl_hlo_file), neff,
                               dir + "/" + std::string(k_lnl_log_file));
  spec.cwd = dir;
  UniqueFd out(::open("/dev/null", O_WRONLY | O_CLOEXEC));
  spec.log_fd = out.get();
  PosixRunner runner;
  auto run = runner.run(spec);
  if (!run) return fatal(run.error().message);
  if (run->end != RunEnd::exited || run->exit_code != 0)
    return fatal(fmt::format("the compiler failed; its log is {}/{}", dir, k_lnl_log_file));
  if (!exists(dir + "/" + std::string(k_lnl_hlo_file)) || !exists(neff))
    return fatal(fmt::format("{}: no NEFF after the compile", dir));
  const uint64_t size = fs::file_size(neff, ec);
  if (auto w = write_plain(dir + "/" + std::string(k_lnl_metadata_file),
                           fmt::format("{{\"cache_key\": \"{}\", \"version\": 0, \"num_outputs\": 1}}\n", key));
      !w)
    return fatal(w.error().message);
  if (auto w = write_plain(marker, lnl_marker(std::time(nullptr), size)); !w) return fatal(w.error().message);
  lock.reset();
  if (auto remote = process_env("NEURON_LIBTORCH_REMOTE_CACHE"); opts.save_cache && remote && !remote->empty()) {
    auto published = save_cache(dir, *remote, key);
    if (!published) return result({Outcome::failed, 0, size, fmt::format("save_cache: {}", published.error().message)});
    saved = *published ? "promoted" : "taken";
    fmt::print(stderr, "INFO: {} {}\n", *published ? "promoted to the remote cache:" : "the remote cache has it already:",
               key);
  }
  return result({Outcome::compiled, 0, size, {}});
}

}  // namespace neffcache::clientsim
