// neffcache-cc: a stand-in for `neuronx-cc` that puts the compile cache in front of the
// real compiler, for clients that compile just in time (torch-xla without
// neuron_parallel_compile, vLLM Neuron, TorchNeuron). Installed also as `neuronx-cc` in
// a folder of its own (<prefix>/lib/neffcache/bin) that users put first in PATH, as
// ccache's "masquerade" folder.
//
//   - The real compiler: $NEFFCACHE_REAL_COMPILER, else the first `neuronx-cc` on PATH
//     that is not this program (whatever link or folder leads to it).
//   - Anything but a compile we understand (--version, help, other subcommands, a
//     command line we cannot read) is exec'd to the real compiler unchanged.
//   - A compile is keyed by its content identity: the real compiler's version, the
//     canonical graph (debug information left out) and the flags that change the result
//     (--target first, then the caller's flags without --verbose; no paths). Its result
//     lives in the entry our key names in the caller's cache, MODULE_<canonical
//     graph>+<flags hash> (the "shim entry"), and the content index knows it, so any
//     twin (an entry compiled by the daemon, neuron_parallel_compile or a client under
//     another name) serves too.
//       hit: the NEFF is copied to --output (its checksum checked), the log file written
//         if asked for, "Compiler status PASS" printed, exit 0;
//       miss: compiled in the steps of every compile (compile/pipeline.hpp): the shim
//         entry's lock is taken (waiting while another process, rank or daemon compiles
//         the same identity, at most NEFFCACHE_COMPILE_TIMEOUT s) and kept alive from
//         then on; the host's memory ledger admits the compile; the real compiler runs
//         with the caller's arguments unchanged, its output and exit status passed
//         through; a NEFF it makes is published in the shim entry and recorded in the
//         index. (Its parts: main.cpp, the cache's side; real_compiler.cpp, the real one.)
//   - An s3:// cache: the shim entry in the bucket is looked up and compiled under its
//     lease (waiting while another host compiles it); a graph compiled on any host
//     under any client's name is found there, since every host names it alike.
//   - Whatever goes wrong on our side (an unreadable HLO, a cache we cannot read or
//     write, a full disk) costs one warning line on stderr and the real compiler runs as
//     if the shim were not there.
// Counters (hits, waited, compiles, fallbacks) are kept in shim-stats.json in
// <cache>/.neffcache (for a bucket: ~/.cache/neffcache).
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/index.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/compile/memory.hpp>
#include <neffcache/compile/peaks.hpp>
#include <neffcache/compile/pipeline.hpp>
#include <neffcache/compile/publish.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/core/size.hpp>
#include <neffcache/store/open.hpp>

#include "common/version.hpp"
#include "shim.hpp"

namespace {

using namespace neffcache;
namespace fs = std::filesystem;
using namespace neffcache::shim;
using SteadyClock = std::chrono::steady_clock;

constexpr double k_default_timeout_seconds = 4 * 3600;  // the longest graphs compile for about an hour

// The cache the caller uses. LNL names its outputs graph_<32 hex key>.neff in its entry
// folder, whose parent is its cache; anything else is the Neuron wrapper, whose cache is
// --cache_dir in NEURON_CC_FLAGS, else NEURON_COMPILE_CACHE_URL, else the default.
std::string caller_cache(const LnlCommand& c) {
  const fs::path out(c.output);
  if (lnl_neff_key(out.filename().string())) return out.parent_path().parent_path().string();
  return {};
}

// Adds one to the counters named in shim-stats.json of the state folder `state`
// (Store::state_dir; best effort).
void count(const std::string& state, std::initializer_list<std::string_view> names) {
  std::error_code ec;
  fs::create_directories(state, ec);
  const std::string path = fmt::format("{}/shim-stats.json", state);
  detail::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd || ::flock(fd.get(), LOCK_EX) != 0) return;
  auto j = nlohmann::ordered_json::parse(detail::read_fd(fd.get()), nullptr, false);
  if (!j.is_object()) j = nlohmann::ordered_json::object();
  for (auto n : names) j[std::string(n)] = j.value(std::string(n), uint64_t{0}) + 1;
  const std::string text = j.dump(2) + "\n";
  if (::ftruncate(fd.get(), 0) == 0) (void)!::pwrite(fd.get(), text.data(), text.size(), 0);
}

// Over a neffcachefs mount the daemon compiles: our entry's graph is written through the
// mount, and opening its NEFF waits for the daemon, which serves a twin from its index,
// joins a compile already running (in this host's processes or, over a bucket, under
// another host's lease) or compiles it once. The NEFF is copied to the caller's output.
// Errors (a failed or refused compile: EIO) are the caller's to handle.
Result<void> compile_through_mount(const store::Store& cache, const std::string& entry, std::string_view hlo_bytes,
                                   const std::vector<std::string>& flags, const std::string& output) {
  auto e = cache.at(entry);
  if (!e) return e.error();
  if (auto put = cache.put_graph(*e, hlo_bytes, flags); !put) return put.error();
  const std::string neff = fmt::format("{}/{}", cache.view(*e), k_neff_file);
  detail::UniqueFd in(::open(neff.c_str(), O_RDONLY | O_CLOEXEC));
  if (!in) return sys_error("open", neff);
  return detail::copy_into_place(in.get(), neff, output);
}

// What the real compiler prints when it succeeds, and the log file it writes.
void say_pass(const LnlCommand& c, const std::string& from) {
  fmt::print("{}: served from the compile cache ({})\nCompiler status PASS\n", k_me, from);
  std::fflush(stdout);
  if (!c.logfile.empty())
    (void)detail::write_file_atomic(c.logfile, fmt::format("{}: served from the compile cache ({})\nCompiler status PASS\n",
                                                           k_me, from));
}

// Admits the compile against the host's memory ledger (shared with every neffcache
// process on the host; NEFFCACHE_MEM_BUDGET, NEFFCACHE_MEM_LEDGER): waits until `need`
// (at most the whole budget) fits by the scheduler's rule (Admission::fits), saying so
// once. Returns the reservation (0: no ledger, or the deadline passed: the compile runs
// anyway, as it would without the shim; or `hold` was lost: the compile will not run, and
// its waiting claim must not hold the host's others back).
uint64_t admit(MemoryLedger* ledger, uint64_t need, const std::string& what, SteadyClock::time_point deadline,
               const EntryHold& hold) {
  if (!ledger) return 0;
  need = std::min(need, ledger->budget());
  bool said = false;
  for (;;) {
    const uint64_t id = ledger->admit([&](MemoryLedger::Admission& a) -> uint64_t {
      if (a.fits(need, ledger->budget())) {
        a.what = what;
        return need;
      }
      a.waiting = need;
      return 0;
    });
    if (id != 0 || SteadyClock::now() >= deadline || hold.lost()) return id;
    if (!said)
      fmt::print(stderr, "{}: waiting for {} of host memory (budget {}) before compiling\n", k_me, format_size(need),
                 format_size(ledger->budget()));
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

double seconds_since(SteadyClock::time_point t) {
  return std::chrono::duration<double>(SteadyClock::now() - t).count();
}

// A compile's graph, as memory admission sees it.
struct Job {
  ContentId id;
  std::string entry;  // our entry, in messages
  uint64_t instructions = 0;
  uint64_t hlo_bytes = 0;
};

// A compile the shim was asked for, as it keys, admits and publishes it.
struct Shim {
  std::string real;
  int argc;
  char** argv;
  LnlCommand call;
  std::string state;    // where we remember things of the cache (Store::state_dir)
  std::string version;  // the real compiler's
  Job job;
  std::string_view hlo_bytes;
  std::vector<std::string> flags;
  SteadyClock::time_point t0, deadline;

  [[noreturn]] void fallback(std::string_view why) const { run_without_cache(real, argc, argv, why); }
  bool waited() const { return seconds_since(t0) > 0.05; }
};

// The real compiler, run once the host's memory ledger admits what compiles of this
// graph (or graphs of its size) peaked at before; its own peak is recorded after. The
// hold is kept alive meanwhile (compile_held). Counted. Returns the compiler's exit
// status and how long it ran; nothing when the hold was lost before the compiler could
// start (another process compiles the graph now).
std::optional<std::pair<int, double>> compile_admitted(const Shim& c, const EntryHold& hold) {
  auto ledger = open_memory_ledger("", "", k_me, [](std::string_view w) { fmt::print(stderr, "{}: warning: {}\n", k_me, w); });
  if (!ledger) fmt::print(stderr, "{}: warning: {}; compiling without the memory budget\n", k_me, ledger.error().message);
  PeakHistory peaks((fs::path(c.state) / fs::path(k_peaks_dir).filename()).string());
  const auto predicted = peaks.predict(c.job.id.str(), c.job.instructions, c.job.hlo_bytes);
  const uint64_t reservation =
      admit(ledger ? ledger->get() : nullptr, predicted.bytes, c.job.entry, c.deadline, hold);
  if (hold.lost()) {
    if (ledger && *ledger) (*ledger)->release(reservation);
    return std::nullopt;
  }
  const auto start = SteadyClock::now();
  const int status = run_real(c.real, c.argc, c.argv, hold.descriptor());
  const double seconds = seconds_since(start);
  if (ledger && *ledger) (*ledger)->release(reservation);
  struct rusage children {};
  if (::getrusage(RUSAGE_CHILDREN, &children) == 0 && status == 0)
    peaks.add(c.job.id.str(), c.job.instructions, c.job.hlo_bytes, static_cast<uint64_t>(children.ru_maxrss));
  count(c.state, {"compiles"});
  return std::pair(status, seconds);
}

// Compiles `c` into our entry at `dest` in the steps of every compile
// (compile/pipeline.hpp), waiting while another process or host holds it. `served` looks
// at the entry's files and serves the caller from them when it can (true: served, PASS
// said and counted; an error: the cache cannot be used); `keep_graph` stores the graph in
// the entry before its NEFF goes in; `published` follows the publish, under the hold.
// A hold lost while we waited for memory passes to its new holder, whose NEFF we wait
// for as for any other. Returns the exit status the caller sees.
int compile_into(const Shim& c, Destination& dest,
                 const std::function<Result<bool>(const EntryFiles&, bool waited)>& served,
                 const std::function<Result<bool>()>& keep_graph, const std::function<void(double seconds)>& published) {
  bool look_failed = false;
  HeldCompile how;
  how.wait_until = c.deadline;
  // A waiter looks between tries: twice a second is soon enough for a compile that takes
  // minutes (a bucket is asked once a second).
  how.min_poll = std::chrono::milliseconds(500);
  how.look = [&](const EntryFiles& files, bool) -> std::optional<CompileResult> {
    auto hit = served(files, c.waited());
    look_failed = !hit;
    if (!hit) return CompileResult::of(CompileOutcome::transient, hit.error().message);
    if (*hit) return CompileResult::of(CompileOutcome::already_done);
    return std::nullopt;
  };
  for (;;) {
    std::optional<std::pair<int, double>> ran;
    bool lost_waiting = false;
    const CompileResult r = compile_held(dest, how, [&](const EntryFiles&, EntryHold& hold) {
      Ran out;
      ran = compile_admitted(c, hold);
      lost_waiting = !ran;
      struct stat st {};
      if (!ran || ran->first != 0 || ::stat(c.call.output.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return out;
      if (hold.lost()) return out;  // (compile_held says so)
      if (auto kept = keep_graph(); !kept) return out.result.message = kept.error().message, out;
      out.result = CompileResult::of(CompileOutcome::success);
      out.produced.neff = c.call.output;
      out.produced.meta = {{"compiler_version", c.version}, {"compile_seconds", ran->second}, {"by", k_me}};
      out.produced.on_published = [&, seconds = ran->second](const std::string&) { published(seconds); };
      return out;
    });
    if (ran) {
      if (ran->first == 0 && r.outcome != CompileOutcome::success && !r.message.empty())
        fmt::print(stderr, "{}: warning: the NEFF was not cached: {}\n", k_me, r.message);
      return ran->first;
    }
    if (r.outcome == CompileOutcome::already_done) return 0;
    if (lost_waiting) {
      fmt::print(stderr, "{}: warning: {}: its lock passed to another holder while this one waited for memory; "
                 "waiting for its NEFF\n", k_me, dest.describe());
      continue;
    }
    // (The entry could not be taken: held past the deadline, or an error.)
    if (!look_failed) count(c.state, {"fallbacks"});
    c.fallback(r.message);
  }
}

// A compile in a cache the shim compiles into itself (a folder, a bucket): a result the
// store's content index knows (any twin), or our entry done, is copied to the output;
// else our entry is compiled where the store says (Store::destination: a folder under
// its lock, an S3 entry under its lease; every host names it alike, so a graph compiled
// on any host under any client's name is found in a bucket) and the result recorded in
// the index. A cache we cannot reach costs one warning and a plain compile.
int compile_in(const Shim& c, const store::Store& cache, bool caller_holds_ours) {
  auto e = cache.at(c.job.entry);
  if (!e) c.fallback(e.error().message);
  auto dest = cache.destination(*e);
  if (!dest) c.fallback(fmt::format("{}: only a folder, a mount or an s3:// cache is served", cache.name()));
  const ContentIndex* index = cache.content_index();
  bool warned = false;  // (asked again at each look while we wait: said once)
  auto served = [&](const EntryFiles& files, bool waited) -> Result<bool> {
    std::string from = cache.view(*e);
    if (index) {
      auto twin = index->find(c.job.id, "", /*with_failures=*/false);
      // Done, but not by a publish of ours: recorded now.
      if (!twin && files.done() && !index->knows(c.job.entry) && index->add(c.job.id, c.job.entry))
        twin = index->find(c.job.id, "", false);
      if (!twin) return false;
      auto placed = detail::copy_into_place(twin->neff.get(), twin->dir, c.call.output, twin->record.xxh3);
      if (!placed) {
        if (!std::exchange(warned, true)) fmt::print(stderr, "{}: warning: {}\n", k_me, placed.error().message);
        return false;
      }
      from = twin->record.entry;
    } else if (files.done()) {
      if (auto got = cache.copy_file(*e, files.neff_name(), c.call.output); !got) return got.error();
    } else if (auto twin = waited ? std::nullopt : cache.find_twin(c.job.id, c.job.entry, false, {})) {
      // (A bucket's index: looked at once, not at each look while we wait, each a download.)
      auto at = cache.at(twin->entry);
      if (!at) return false;
      if (auto got = cache.copy_file(*at, EntryFiles::of_entry_path(twin->entry).neff_name(), c.call.output); !got) {
        if (!std::exchange(warned, true)) fmt::print(stderr, "{}: warning: {}\n", k_me, got.error().message);
        return false;
      }
      from = cache.view(*at);
    } else {
      return false;
    }
    say_pass(c.call, from);
    count(c.state, {waited ? "waited" : "hits"});
    return true;
  };
  auto files = (*dest)->files();
  if (!files && !index) c.fallback(files.error().message);
  auto hit = served(files ? *files : EntryFiles{}, false);  // (no folder yet: a twin may still serve)
  if (!hit) c.fallback(hit.error().message);
  if (*hit) return 0;
  if (auto why = cache.unchangeable()) c.fallback(why->message);
  if (caller_holds_ours) exec_real(c.real, c.argc, c.argv);
  if (auto made = (*dest)->make(); !made) c.fallback(made.error().message);
  const int status = compile_into(
      c, **dest, served, [&] { return cache.put_graph(*e, c.hlo_bytes, c.flags); },
      [&](double seconds) {
        if (auto r = cache.record_result(*e, c.job.id, seconds); !r)
          fmt::print(stderr, "{}: warning: the content index did not record {}: {}\n", k_me, c.job.entry,
                     r.error().message);
      });
  if (status != 0) (*dest)->unmake();
  return status;
}

}  // namespace

// What `neffcache-cc --neffcache-help` prints (and its man page shows): its command line is
// the real compiler's, so its own settings are environment variables.
constexpr std::string_view k_shim_help = R"(Usage: neuronx-cc ARGUMENTS... (neffcache-cc, first in PATH under the name neuronx-cc)
       neffcache-cc --neffcache-help | --neffcache-version

neffcache-cc puts the Neuron compile cache in front of the real neuronx-cc, for clients that compile
just in time (torch-xla without neuron_parallel_compile, vLLM Neuron, TorchNeuron). A compile of an
XLA graph is keyed by the real compiler's version, the canonical graph and the flags that change the
result; a graph compiled before, under any entry's name, is served from the cache; a miss compiles
once, under the entry's lock (on S3, its lease), while every other caller of the same graph waits.
Anything else (--version, --help, other subcommands, a command line it cannot read) runs the real
compiler unchanged, and so does every compile when something on the cache's side goes wrong (one
warning line on stderr). Counters go to shim-stats.json in <cache>/.neffcache (for a bucket:
~/.cache/neffcache).

Options:
  --neffcache-help     print this text and exit (as the only argument)
  --neffcache-version  print neffcache-cc's version and the real compiler's path and version, and
                       exit (as the only argument); --version is the real compiler's, unchanged
                       (callers parse its first line, even with stderr merged into stdout)

Environment:
  NEFFCACHE_REAL_COMPILER    the real compiler: a path, or a name looked up in PATH (default: the first
                             neuronx-cc in PATH that is not neffcache-cc)
  NEFFCACHE_DISABLE          set and not 0: every call runs the real compiler, without the cache
  NEFFCACHE_COMPILE_TIMEOUT  seconds a caller waits for another process's compile of the same graph
                             before it compiles without the cache (default 14400)
  NEURON_CC_FLAGS            its --cache_dir=URL names the cache (first), as for the Neuron wrapper
  NEURON_COMPILE_CACHE_URL   the cache when NEURON_CC_FLAGS names none (default:
                             /var/tmp/neuron-compile-cache); an s3:// URL is a bucket
  NEFFCACHE_MEM_BUDGET       host memory compiles may reserve (a size, a share such as 70%, or off)
  NEFFCACHE_MEM_LEDGER       the folder of the host's memory reservations
)";

int main(int argc, char** argv) {
  note_inherited_descriptors();
  const std::string self = real_path("/proc/self/exe");
  // Words the real compiler does not know, alone on the command line: ours.
  if (argc == 2 && std::string_view(argv[1]) == "--neffcache-help") {
    fmt::print("{}", k_shim_help);
    return 0;
  }
  auto real = find_real_compiler(self);
  if (argc == 2 && std::string_view(argv[1]) == "--neffcache-version") {
    std::string compiler = real ? *real : fmt::format("none ({})", real.error().message);
    if (real) {
      auto v = detect_compiler_version(*real);
      compiler += v ? fmt::format(", version {}", *v) : fmt::format(" (no version: {})", v.error().message);
    }
    fmt::print("neffcache-cc (neffcache) {}\nreal compiler: {}\n", program_version(), compiler);
    return 0;
  }
  if (!real) {
    fmt::print(stderr, "{}: error: {}\n", k_me, real.error().message);
    return 127;
  }
  const std::vector<std::string> words(argv, argv + argc);
  auto call = parse_compile_words(words);
  // Not a compile we can read: the real compiler answers, exactly as it would.
  if (!call || call->output.empty()) exec_real(*real, argc, argv);
  if (auto off = process_env("NEFFCACHE_DISABLE"); off && !off->empty() && *off != "0") exec_real(*real, argc, argv);
  if (call->framework != "XLA") run_without_cache(*real, argc, argv, fmt::format("framework {} is not cached", call->framework));
  // A word that names an existing file besides the input: we may have taken the wrong
  // word for the input. Never key a compile on a guess.
  for (const auto& f : call->flags)
    if (!f.starts_with('-') && f.find('/') != std::string::npos && ::access(f.c_str(), F_OK) == 0)
      run_without_cache(*real, argc, argv, fmt::format("cannot tell the input among the arguments ({})", f));

  auto cache = store::open_store(caller_cache(*call));
  if (!cache) run_without_cache(*real, argc, argv, cache.error().message);
  const std::string state = (*cache)->state_dir();

  auto bytes = detail::read_file(call->input);
  if (!bytes) run_without_cache(*real, argc, argv, fmt::format("cannot read {}", call->input));
  auto version = compiler_version(*real, state);
  if (!version) run_without_cache(*real, argc, argv, version.error().message);
  const std::vector<std::string> flags = lnl_key_flags(*call);
  // The graph is read and hashed once: our key (entry_key's) and the identity both come from it.
  auto hlo = analyze_hlo(*bytes);
  if (!hlo) run_without_cache(*real, argc, argv, fmt::format("{}: {}", call->input, hlo.error().message));
  const EntryKey key{*version, hlo->graph_hash, flags_hash(flags)};
  const ContentId id{key.compiler_dir(), hlo->canonical_sha256, key.flags_hash};
  const std::string entry = key.relative_path();
  // The Neuron wrapper compiles into a work folder, naming the files after its entry
  // (model.<MODULE key>.neff). If that entry is ours, the caller holds its lock already
  // (on S3: its lease): waiting for it (or for a daemon that waits for it) would wait for
  // ever.
  const bool caller_holds_ours = fs::path(call->output).filename() == fmt::format("model.{}.neff", key.module_dir());
  const auto t0 = SteadyClock::now();
  double timeout = k_default_timeout_seconds;
  if (auto t = process_env("NEFFCACHE_COMPILE_TIMEOUT"); t && !t->empty()) timeout = std::atof(t->c_str());
  const auto deadline = t0 + std::chrono::duration_cast<SteadyClock::duration>(std::chrono::duration<double>(timeout));
  const Shim shim{*real, argc, argv, *call, state, *version, Job{id, entry, hlo->stats.instructions, bytes->size()},
                  *bytes, flags, t0, deadline};
  if (!(*cache)->compiles_on_open()) return compile_in(shim, **cache, caller_holds_ours);
  if (caller_holds_ours) exec_real(*real, argc, argv);
  if (auto done = compile_through_mount(**cache, entry, *bytes, flags, call->output); !done)
    shim.fallback(done.error().message);
  say_pass(*call, entry);
  return 0;
}
