// neuron-client-sim [options] HLO_OR_DIR...: behaves toward a Neuron compile cache as a
// torch-xla training process with libneuronxla does, for tests and demos on machines
// where the real client cannot run.
//
// With NEURON_EXTRACT_GRAPHS_ONLY=1 (a neuron_parallel_compile trial run) it writes each
// graph's entry (compile_flags.json, model.hlo_module.pb) and prints the "Extracting
// graphs (...)" line, a little time apart. Otherwise it runs training steps; the first
// use of each graph looks in the cache, under the cache-wide lock <root>/lock (opened
// for writing and flocked, hits included, as libneuronxla does):
//   - model.neff and model.done there: read the NEFF ("Using a cached neff at ...");
//   - model.log and no NEFF: a cached failure, reported, not retried;
//   - else take the existence lock <hlo>.lock (O_EXCL), write the HLO, run the compiler
//     in a private work folder, copy the NEFF in, write model.done, remove the lock. A
//     lock that exists already means another process compiles: poll until it is gone.
// A killed simulator leaves its lock behind, as the real client does. With
// NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG set (by neuron_parallel_compile), it writes the
// cache it resolved into that file first, as the Neuron wrapper does.
//
// With --dialect lnl it behaves as vLLM Neuron and TorchNeuron (libtorch_neuronx_lite)
// do toward their cache, <$VLLM_CACHE_ROOT or $NEURON_LIBTORCH_CACHE_ROOT>/neuron/
// compile_cache/<key>/ (see load_lnl).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/file.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/core/detail/digest.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/compile/runner.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include <neffcache/store/directory.hpp>

#include "neffcache/common.hpp"

namespace {

using namespace neffcache;
namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* k_cache_tag = "INFO ||NEURON_CACHE||:";
constexpr const char* k_wrapper_tag = "INFO ||NEURON_CC_WRAPPER||:";

struct Options {
  std::vector<std::string> inputs;
  std::vector<std::string> flags;
  std::string compiler_version;
  std::string compiler{k_default_compiler_template};
  int steps = 1;
  double extract_interval = 0.1;
  double step_seconds = 0;
  double poll_seconds = 0.2;
  double max_wait = 0;
  bool json = false;
  std::string dialect = "neuron";
  std::string target = "trn1";
  bool save_cache = false;
  std::string key = "canonical";
};

enum class Outcome { extracted, hit, waited, fetched, compiled, failed };

const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::extracted: return "extracted";
    case Outcome::hit: return "hit";
    case Outcome::waited: return "waited";
    case Outcome::fetched: return "fetched";
    case Outcome::compiled: return "compiled";
    case Outcome::failed: return "failed";
  }
  return "?";
}

struct Graph {
  std::string input;  // the HLO file given
  std::string bytes;
  std::string canonical_sha256;
  std::string entry;  // its entry folder in the cache
};

struct GraphResult {
  Outcome outcome = Outcome::failed;
  double seconds = 0;  // blocked on the cache: reads, waits for locks, own compiles
  uint64_t neff_bytes = 0;
  std::string error;
};

double since(SteadyClock::time_point t) { return std::chrono::duration<double>(SteadyClock::now() - t).count(); }

bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

void sleep_for(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// Reads a NEFF whole. A fake-neuronx-cc artifact must be intact and name this graph.
Result<uint64_t> read_neff(const std::string& path, const Graph& g) {
  auto bytes = read_file(path);
  if (!bytes) return bytes.error();
  if (bytes->starts_with(fake::k_magic)) {
    auto neff = fake::parse_fake_neff(*bytes);
    if (!neff) return Error{Errc::io, fmt::format("{}: a partial or altered NEFF", path)};
    if (neff->graph != g.canonical_sha256)
      return Error{Errc::io, fmt::format("{}: the NEFF of another graph", path)};
  }
  return static_cast<uint64_t>(bytes->size());
}

// Our own compile, under the existence lock we hold, as libneuronxla does it.
GraphResult compile_here(const Graph& g, const CompilerTemplate& tmpl,
                         const std::vector<std::string>& flags) {
  GraphResult r;
  const std::string neff = g.entry + "/" + std::string(k_neff_file);
  if (auto s = store_graph(g.entry, g.bytes, flags); !s) return {Outcome::failed, 0, 0, s.error().message};
  std::string base = getenv_or("TMPDIR", "/tmp") + "/neuroncc_compile_workdir";
  fs::create_directories(base);
  std::string workdir = base + "/XXXXXX";
  if (!::mkdtemp(workdir.data())) return {Outcome::failed, 0, 0, sys_error("create", workdir).message};
  const std::string key = fs::path(g.entry).filename().string();
  const std::string hlo_copy = fmt::format("{}/model.{}.hlo_module.pb", workdir, key);
  const std::string neff_out = fmt::format("{}/model.{}.neff", workdir, key);
  const std::string log_path = workdir + "/compile.log";
  auto finish = [&](GraphResult res) {
    fs::remove_all(workdir);
    return res;
  };
  if (auto w = write_file_atomic(hlo_copy, g.bytes); !w) return finish({Outcome::failed, 0, 0, w.error().message});
  UniqueFd log(::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  RunSpec spec;
  spec.argv = tmpl.expand({hlo_copy, neff_out, workdir, key, flags});
  spec.cwd = workdir;
  spec.log_fd = log.get();
  PosixRunner runner;
  auto run = runner.run(spec);
  if (!run) return finish({Outcome::failed, 0, 0, run.error().message});
  if (run->end != RunEnd::exited || run->exit_code != 0 || !exists(neff_out)) {
    // A failure is cached, as the Neuron cache does: model.log with the compiler's output.
    (void)detail::copy_file_hashed(log_path, g.entry + "/" + std::string(k_log_file), 0644);
    return finish({Outcome::failed, 0, 0, fmt::format("the compiler failed; its output is in {}/{}", g.entry, k_log_file)});
  }
  ::unlink(neff.c_str());  // a partial copy of an earlier, killed client
  auto copied = detail::copy_file_hashed(neff_out, neff, 0644);
  if (!copied) return finish({Outcome::failed, 0, 0, copied.error().message});
  if (auto d = write_file_atomic(g.entry + "/" + std::string(k_done_file), ""); !d)
    return finish({Outcome::failed, 0, 0, d.error().message});
  r.outcome = Outcome::compiled;
  r.neff_bytes = static_cast<uint64_t>(fs::file_size(neff));
  return finish(r);
}

// The cache-wide lock libneuronxla takes for every look into its cache, hits included:
// <root>/lock, opened for writing (made if missing) and flocked. On a read-only cache
// this is where the real client stops ("[Errno 30] Read-only file system"), and so does
// the simulator, with the same words.
Result<UniqueFd> lock_cache_root(const std::string& root) {
  std::error_code ec;
  fs::create_directories(root, ec);  // (a cold cache; a read-only one fails below)
  const std::string path = root + "/lock";
  UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  if (!fd) return Error{Errc::io, fmt::format("[Errno {}] {}: '{}'", errno, std::strerror(errno), path), errno};
  while (::flock(fd.get(), LOCK_EX) != 0)
    if (errno != EINTR) return sys_error("lock", path);
  return fd;
}

// The first use of a graph in training.
GraphResult load(const Graph& g, const Options& opts, const CompilerTemplate& tmpl,
                 const std::vector<std::string>& flags, const std::string& root, const EntryKey& key) {
  const auto t0 = SteadyClock::now();
  const std::string neff = g.entry + "/" + std::string(k_neff_file);
  const std::string done = g.entry + "/" + std::string(k_done_file);
  const std::string log = g.entry + "/" + std::string(k_log_file);
  const std::string lock = g.entry + "/" + std::string(k_hlo_module_file) + ".lock";
  bool waited = false;
  int minutes_reported = 0;
  auto result = [&](GraphResult r) {
    r.seconds = since(t0);
    return r;
  };
  for (;;) {
    auto root_lock = lock_cache_root(root);
    if (!root_lock) return result({Outcome::failed, 0, 0, root_lock.error().message});
    if (exists(neff) && exists(done)) {
      auto n = read_neff(neff, g);
      if (!n) return result({Outcome::failed, 0, 0, n.error().message});
      fmt::print(stderr, "{} Using a cached neff at {}. Exiting with a successfully compiled graph.\n", k_cache_tag, neff);
      return result({waited ? Outcome::waited : Outcome::hit, 0, *n, {}});
    }
    if (exists(log) && !exists(neff)) {
      fmt::print(stderr,
                 "{} Got a cached failed neff at {}. Will skip compilation, please set --retry_failed_compilation "
                 "for recompilation.\n",
                 k_cache_tag, neff);
      return result({Outcome::failed, 0, 0, fmt::format("a cached failure: {}", log)});
    }
    if (auto e = make_entry_folder(root, key); !e) return result({Outcome::failed, 0, 0, e.error().message});
    int fd = ::open(lock.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    root_lock->reset();  // (not held over a compile or a wait)
    if (fd >= 0) {
      ::close(fd);
      if (exists(neff) && exists(done)) {
        ::unlink(lock.c_str());  // finished while we looked: read it on the next turn
        continue;
      }
      fmt::print(stderr, "{} Compiling {}\n", k_wrapper_tag, g.entry);
      GraphResult r = compile_here(g, tmpl, flags);
      ::unlink(lock.c_str());
      return result(r);
    }
    if (errno != EEXIST) return result({Outcome::failed, 0, 0, sys_error("create", lock).message});
    waited = true;
    const double waiting = since(t0);
    if (opts.max_wait > 0 && waiting > opts.max_wait)
      return result({Outcome::failed, 0, 0, fmt::format("gave up after {:.0f} s waiting for {}", waiting, lock)});
    if (static_cast<int>(waiting / 60) > minutes_reported) {
      minutes_reported = static_cast<int>(waiting / 60);
      fmt::print(stderr, "{} Another process must be compiling {}, been waiting for: {} minutes\n", k_cache_tag,
                 fs::path(g.entry).filename().string(), minutes_reported);
    }
    sleep_for(opts.poll_seconds);
  }
}

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

// The HLO files named: files, and the *.pb files of folders, in name order.
Result<std::vector<std::string>> hlo_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(in, ec))
        if (e.is_regular_file() && e.path().extension() == ".pb") found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      return Error{Errc::not_found, fmt::format("{}: no such HLO file or folder", in)};
    }
  }
  if (files.empty()) return Error{Errc::not_found, "no HLO files (*.pb) in the folders given"};
  return files;
}

int fail(const std::string& message) {
  fmt::print(stderr, "neuron-client-sim: error: {}\n", message);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  CLI::App app{"neuron-client-sim: a stand-in for a torch-xla training process using the Neuron compile cache "
               "(graph extraction with NEURON_EXTRACT_GRAPHS_ONLY=1, else training steps that load or compile "
               "each graph)"};
  app.add_option("HLO", opts.inputs, "HLO files, or folders of them (*.pb)")->required();
  app.add_option("--flag", opts.flags, "a compiler flag (repeat; default: the compiler flags in NEURON_CC_FLAGS)")
      ->allow_extra_args(false);
  app.add_option("--compiler-version", opts.compiler_version, "default: asks '<compiler> --version'");
  app.add_option("--compiler", opts.compiler, "compiler command template for compiles on a miss")->capture_default_str();
  app.add_option("--steps", opts.steps, "training steps; graphs are loaded at their first use")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--step-seconds", opts.step_seconds, "device time of one step")->check(CLI::NonNegativeNumber);
  app.add_option("--extract-interval", opts.extract_interval, "seconds between two extracted graphs")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--poll", opts.poll_seconds, "seconds between two looks at a lock held by another process")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-wait", opts.max_wait, "give a graph up after waiting this long for another process's "
                                              "lock (default: wait forever, as torch-xla does)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--json", opts.json, "print the summary as JSON on stdout");
  app.add_option("--dialect", opts.dialect, "the client: neuron (torch-xla, libneuronxla) or lnl (vLLM Neuron, "
                                            "TorchNeuron: libtorch_neuronx_lite)")
      ->check(CLI::IsMember({"neuron", "lnl"}))
      ->capture_default_str();
  app.add_option("--target", opts.target, "lnl: the platform target its compiles name")->capture_default_str();
  app.add_option("--key", opts.key,
                 "how entries are named: canonical (our key: graphs that differ only in debug information share "
                 "one) or raw (as the real clients name them: a hash of the HLO's bytes as written, debug "
                 "information included, and of the flags)")
      ->check(CLI::IsMember({"canonical", "raw"}))
      ->capture_default_str();
  app.add_flag("--save-cache", opts.save_cache,
               "lnl: after a compile, save_cache() it to NEURON_LIBTORCH_REMOTE_CACHE (a staging copy there, renamed "
               "to the key; a key taken already is left alone)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  // An s3:// cache is for graph extraction only: the simulator stores graphs there as
  // the Neuron wrapper does; training reads an S3 cache through a neffcachefs mount.
  // Training reads the files of a local folder, as torch-xla does.
  const bool lnl = opts.dialect == "lnl";
  auto cache = cli::open_cache(lnl ? lnl_cache_root() : "");
  if (!cache) return fail(cache.error().message);
  const auto* folder = dynamic_cast<const store::DirectoryStore*>(cache->get());
  const std::string extract_env = process_env("NEURON_EXTRACT_GRAPHS_ONLY").value_or("");
  const bool extract = !extract_env.empty() && extract_env != "0";
  if (lnl && extract) return fail("--dialect lnl: graph extraction is torch-xla's (NEURON_EXTRACT_GRAPHS_ONLY)");
  if (!folder && !extract)
    return fail(fmt::format("{}: only graph extraction is simulated on an s3:// cache (mount it with neffcachefs "
                            "to train)", (*cache)->name()));
  const std::string root = (*cache)->name();
  // Under neuron_parallel_compile, say which cache this process uses, as the Neuron
  // wrapper does: the tool compiles into that one.
  if (auto log = process_env("NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG"); log && !log->empty())
    if (auto w = detail::write_file_atomic(*log, root + "\n"); !w)
      return fail(fmt::format("NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG: {}", w.error().message));
  auto flags = cli::compiler_flags(opts.flags);
  if (!flags) return fail(flags.error().message);
  auto tmpl = CompilerTemplate::parse(opts.compiler);
  if (!tmpl) return fail(tmpl.error().message);
  auto version = cli::compiler_version(opts.compiler_version, tmpl->program());
  if (!version) return fail(version.error().message);
  auto files = hlo_files(opts.inputs);
  if (!files) return fail(files.error().message);

  std::vector<Graph> graphs;
  std::vector<EntryKey> keys;
  for (const auto& f : *files) {
    auto bytes = read_file(f);
    if (!bytes) return fail(bytes.error().message);
    auto hlo = analyze_hlo(*bytes);
    if (!hlo) return fail(fmt::format("{}: {}", f, hlo.error().message));
    auto key = entry_key(*bytes, flags->compiler_flags, *version);
    if (!key) return fail(fmt::format("{}: {}", f, key.error().message));
    // --key raw: the graph is named as the real clients name it, by its bytes as
    // written, debug information included (torch-xla: a decimal 64-bit number).
    const std::string raw_hash = fmt::format("{}", detail::xxh3_64(*bytes + "\n" + python_json_list(flags->compiler_flags)));
    if (opts.key == "raw") key->graph_hash = raw_hash;
    // LNL's key, 32 hex digits: every rank of a job computes the same from the same
    // graph, compiler arguments, compiler and target.
    std::string path = lnl ? detail::md5_hex(fmt::format("{}|{}|{}|{}", opts.key == "raw" ? raw_hash : hlo->canonical_sha256,
                                                         python_json_list(flags->compiler_flags), *version, opts.target))
                           : key->relative_path();
    auto entry = (*cache)->at(path);
    if (!entry) return fail(entry.error().message);
    graphs.push_back({f, std::move(*bytes), hlo->canonical_sha256, entry->view()});
    keys.push_back(*key);
  }

  std::vector<GraphResult> results(graphs.size());
  std::vector<std::string> saved(graphs.size());  // LNL with --save-cache: see load_lnl
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  const auto start = SteadyClock::now();
  if (extract) {
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      if (i > 0) sleep_for(opts.extract_interval);
      auto entry = (*cache)->at(keys[i].relative_path());
      Result<bool> stored = entry ? (*cache)->put_graph(*entry, graphs[i].bytes, flags->compiler_flags)
                                  : Result<bool>(entry.error());
      if (!stored) {
        results[i] = {Outcome::failed, 0, 0, stored.error().message};
        continue;
      }
      results[i].outcome = Outcome::extracted;
      fmt::print(stderr, "{} Extracting graphs ({}/{}) for ahead-of-time parallel compilation. No compilation was done.\n",
                 k_wrapper_tag, graphs[i].entry, k_hlo_module_file);
    }
  } else {
    for (int step = 1; step <= opts.steps; ++step) {
      const auto t0 = SteadyClock::now();
      double on_cache = 0;
      for (std::size_t i = 0; i < graphs.size() && step == 1; ++i) {
        results[i] = lnl ? load_lnl(graphs[i], opts, *tmpl, flags->compiler_flags, folder->root(),
                                    fs::path(graphs[i].entry).filename().string(), saved[i])
                         : load(graphs[i], opts, *tmpl, flags->compiler_flags, folder->root(), keys[i]);
        on_cache += results[i].seconds;
        if (results[i].outcome != Outcome::failed) continue;
        fmt::print(stderr, "neuron-client-sim: error: {}: {}\n", graphs[i].input, results[i].error);
        if (!lnl) continue;
        // LNL ends the process at its first error; the graphs after it are never loaded.
        fmt::print(stderr, "FATAL: {}\n", results[i].error);
        for (std::size_t j = i + 1; j < graphs.size(); ++j) results[j] = {Outcome::failed, 0, 0, "not reached"};
        break;
      }
      sleep_for(opts.step_seconds);
      steps.push_back(nlohmann::ordered_json{{"step", step}, {"seconds", since(t0)}, {"cache_seconds", on_cache}});
      fmt::print(stderr, "step {}: {:.3f} s, {:.3f} s of it waiting on the cache\n", step, since(t0), on_cache);
    }
  }

  std::map<std::string, int> counts;
  double cache_seconds = 0, worst = 0;
  nlohmann::ordered_json per_graph = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < graphs.size(); ++i) {
    const auto& r = results[i];
    ++counts[to_string(r.outcome)];
    cache_seconds += r.seconds;
    worst = std::max(worst, r.seconds);
    nlohmann::ordered_json j{{"hlo", graphs[i].input}, {"entry", graphs[i].entry}, {"outcome", to_string(r.outcome)},
                             {"seconds", r.seconds}, {"neff_bytes", r.neff_bytes}};
    if (!r.error.empty()) j["error"] = r.error;
    if (!saved[i].empty()) ++counts[saved[i]], j["saved"] = saved[i];
    per_graph.push_back(std::move(j));
  }
  const int failed = counts["failed"];
  if (opts.json) {
    nlohmann::ordered_json summary{{"mode", std::string(extract ? "extract" : "train")},
                                   {"cache", root},
                                   {"graphs", graphs.size()},
                                   {"extracted", counts["extracted"]},
                                   {"hits", counts["hit"]},
                                   {"waited", counts["waited"]},
                                   {"fetched", counts["fetched"]},
                                   {"compiled", counts["compiled"]},
                                   {"promoted", counts["promoted"]},
                                   {"promotion_refused", counts["taken"]},
                                   {"failed", failed},
                                   {"cache_seconds", cache_seconds},
                                   {"worst_graph_seconds", worst},
                                   {"seconds", since(start)},
                                   {"steps", std::move(steps)},
                                   {"per_graph", std::move(per_graph)}};
    fmt::print("{}\n", summary.dump(2));
  } else if (extract) {
    fmt::print("{} graphs extracted, {} failed, in {:.2f} s\n", counts["extracted"], failed, since(start));
  } else {
    fmt::print("{} graphs: {} cache hits, {} compiled here, {} after waiting for another process's lock, {} fetched "
               "from the remote cache, {} failed; {:.2f} s waiting on the cache (worst graph {:.2f} s)\n",
               graphs.size(), counts["hit"], counts["compiled"], counts["waited"], counts["fetched"], failed,
               cache_seconds, worst);
  }
  return failed > 0 ? 1 : 0;
}
