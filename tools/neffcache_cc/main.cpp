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
//       miss: the shim entry's lock is taken (waiting while another process, rank or
//         daemon compiles the same identity, at most NEFFCACHE_COMPILE_TIMEOUT s), then
//         the real compiler runs with the caller's arguments unchanged, its output and
//         exit status passed through; a NEFF it makes is published in the shim entry
//         and recorded in the index.
//   - An s3:// cache: the shim entry in the bucket is looked up and compiled under its
//     lease (waiting while another host compiles it); a graph compiled on any host
//     under any client's name is found there, since every host names it alike.
//   - Whatever goes wrong on our side (an unreadable HLO, a cache we cannot read or
//     write, a full disk) costs one warning line on stderr and the real compiler runs as
//     if the shim were not there.
// Counters (hits, waited, compiles, fallbacks) are kept in shim-stats.json in
// <cache>/.neffcache (for a bucket: ~/.cache/neffcache).
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <mutex>
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
#include <neffcache/cache/lock.hpp>
#include <neffcache/compile/memory.hpp>
#include <neffcache/compile/peaks.hpp>
#include <neffcache/compile/publish.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/core/size.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/lease.hpp>
#include <neffcache/store/directory.hpp>
#include <neffcache/store/open.hpp>
#include <neffcache/store/s3.hpp>

namespace {

using namespace neffcache;
namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* k_me = "neffcache-cc";
constexpr const char* k_compiler_name = "neuronx-cc";
constexpr double k_default_timeout_seconds = 4 * 3600;  // the longest graphs compile for about an hour

std::string real_path(const std::string& p) {
  std::error_code ec;
  auto r = fs::canonical(p, ec);
  return ec ? std::string() : r.string();
}

bool executable_file(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// The real compiler: $NEFFCACHE_REAL_COMPILER (a path, or a name looked up on PATH),
// else the first neuronx-cc on PATH that is not this program. Never this program.
Result<std::string> find_real_compiler(const std::string& self) {
  auto is_self = [&](const std::string& p) { return !self.empty() && real_path(p) == self; };
  auto on_path = [&](const std::string& name) -> std::optional<std::string> {
    const std::string path_var = process_env("PATH").value_or("/usr/local/bin:/usr/bin:/bin");
    std::string_view path = path_var;
    while (true) {
      auto colon = path.find(':');
      std::string_view dir = path.substr(0, colon);
      const std::string candidate = fmt::format("{}/{}", dir.empty() ? std::string_view(".") : dir, name);
      if (executable_file(candidate) && !is_self(candidate)) return candidate;
      if (colon == std::string_view::npos) return std::nullopt;
      path.remove_prefix(colon + 1);
    }
  };
  if (auto given = process_env("NEFFCACHE_REAL_COMPILER"); given && !given->empty()) {
    std::optional<std::string> found = given->find('/') != std::string::npos
                                           ? (executable_file(*given) ? std::optional(*given) : std::nullopt)
                                           : on_path(*given);
    if (!found) return Error{Errc::not_found, fmt::format("NEFFCACHE_REAL_COMPILER={}: no such program", *given)};
    if (is_self(*found))
      return Error{Errc::invalid_argument, fmt::format("NEFFCACHE_REAL_COMPILER={} is {} itself", *given, k_me)};
    return *found;
  }
  if (auto found = on_path(k_compiler_name)) return *found;
  return Error{Errc::not_found,
               fmt::format("no real {} on PATH besides this one (set NEFFCACHE_REAL_COMPILER)", k_compiler_name)};
}

[[noreturn]] void exec_real(const std::string& real, int argc, char** argv) {
  std::vector<char*> args{const_cast<char*>(real.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  ::execv(real.c_str(), args.data());
  fmt::print(stderr, "{}: error: cannot run {}: {}\n", k_me, real, std::strerror(errno));
  std::exit(127);
}

// The cache the caller uses. LNL names its outputs graph_<32 hex key>.neff in its entry
// folder, whose parent is its cache; anything else is the Neuron wrapper, whose cache is
// --cache_dir in NEURON_CC_FLAGS, else NEURON_COMPILE_CACHE_URL, else the default.
std::string caller_cache(const LnlCommand& c) {
  const fs::path out(c.output);
  if (lnl_neff_key(out.filename().string())) return out.parent_path().parent_path().string();
  return {};
}

// Where the shim keeps what it remembers of a cache (the compiler's version, counters,
// the peaks of its compiles): the cache's private folder, or for a bucket (mounted or
// not) the user's own cache folder.
std::string state_dir(const std::string& backing) {
  if (backing.starts_with("s3://")) return fmt::format("{}/.cache/neffcache", detail::getenv_or("HOME", "/root"));
  return fmt::format("{}/{}", backing, k_private_prefix);
}

// The real compiler's version, asked once per build of it: remembered in the state
// folder under the identity of the compiler's file (path, inode, size, times).
Result<std::string> compiler_version(const std::string& real, const std::string& backing) {
  struct stat st {};
  const std::string resolved = real_path(real);
  if (resolved.empty() || ::stat(resolved.c_str(), &st) != 0) return sys_error("stat", real);
  const std::string id = detail::xxh3_hex(detail::xxh3_64(fmt::format(
      "{}|{}|{}|{}|{}|{}", resolved, st.st_ino, st.st_size, st.st_mtim.tv_sec, st.st_mtim.tv_nsec, st.st_ctim.tv_sec)));
  const std::string memo = fmt::format("{}/compilers/{}", state_dir(backing), id);
  if (auto text = detail::read_file(memo); text && check_compiler_version(*text)) return *text;
  auto v = detect_compiler_version(real);
  if (!v) return v;
  std::error_code ec;
  fs::create_directories(fs::path(memo).parent_path(), ec);
  (void)detail::write_file_atomic(memo, *v);  // best effort: asked again next time
  return v;
}

// Adds one to the counters named in shim-stats.json of the state folder (best effort).
void count(const std::string& backing, std::initializer_list<std::string_view> names) {
  std::error_code ec;
  fs::create_directories(state_dir(backing), ec);
  const std::string path = fmt::format("{}/shim-stats.json", state_dir(backing));
  detail::UniqueFd fd(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644));
  if (!fd || ::flock(fd.get(), LOCK_EX) != 0) return;
  auto j = nlohmann::ordered_json::parse(detail::read_fd(fd.get()), nullptr, false);
  if (!j.is_object()) j = nlohmann::ordered_json::object();
  for (auto n : names) j[std::string(n)] = j.value(std::string(n), uint64_t{0}) + 1;
  const std::string text = j.dump(2) + "\n";
  if (::ftruncate(fd.get(), 0) == 0) (void)!::pwrite(fd.get(), text.data(), text.size(), 0);
}

// Places the NEFF `twin` holds at `output` (a temporary file beside it, renamed), checked
// against the checksum the index recorded.
Result<void> place_output(const Twin& twin, const std::string& output) {
  const std::string tmp = fmt::format("{}.{}-{}", output, k_me, detail::random_hex64());
  detail::UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!out) return sys_error("create", tmp);
  auto fail = [&](Error e) -> Result<void> {
    ::unlink(tmp.c_str());
    return e;
  };
  auto h = detail::copy_hashed(twin.neff.get(), twin.dir, out.get(), tmp);
  if (!h) return fail(h.error());
  if (detail::xxh3_hex(*h) != twin.record.xxh3)
    return fail(Error{Errc::io, fmt::format("{}: the NEFF changed while it was copied", twin.dir)});
  out.reset();
  if (::rename(tmp.c_str(), output.c_str()) != 0) return fail(sys_error("rename", output));
  return {};
}

// What the real compiler prints when it succeeds, and the log file it writes.
void say_pass(const LnlCommand& c, const std::string& from) {
  fmt::print("{}: served from the compile cache ({})\nCompiler status PASS\n", k_me, from);
  std::fflush(stdout);
  if (!c.logfile.empty())
    (void)detail::write_file_atomic(c.logfile, fmt::format("{}: served from the compile cache ({})\nCompiler status PASS\n",
                                                           k_me, from));
}

// What keeps the lock of a compile alive from the wait for memory to the compiler's end: a
// descriptor the compiler inherits (our entry lock's, so that it stays held if we die
// first), a beat run every `every` (a lock's heartbeat, a lease's renewal), and what the
// beat sets when it finds the hold taken over (a lease that expired while we could not
// renew it): then the compile does not start.
struct Keepalive {
  int inherit_fd = -1;
  std::chrono::milliseconds every{0};
  std::function<void()> beat;
  const std::atomic<bool>* lost = nullptr;
};

// Runs a Keepalive's beat (a copy of it) on a thread of its own, every `every` from
// construction (the first one `every` after it) to destruction, which waits for a beat
// under way (a renewal: at most the S3 client's timeout).
class Beating {
 public:
  explicit Beating(const Keepalive& alive) {
    if (alive.beat)
      thread_ = std::thread([this, every = alive.every, beat = alive.beat] {
        std::unique_lock lk(mu_);
        while (!cv_.wait_for(lk, every, [&] { return done_; })) beat();
      });
  }
  ~Beating() {
    {
      std::lock_guard lk(mu_);
      done_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }
  Beating(const Beating&) = delete;
  Beating& operator=(const Beating&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// Runs the real compiler with the caller's arguments, stdio shared, in our process group
// (so a Ctrl-C reaches it as it would without us); it inherits `inherit_fd`. Returns the
// exit status the caller should see (128 + signal for a signal).
int run_real(const std::string& real, int argc, char** argv, int inherit_fd) {
  std::vector<char*> args{const_cast<char*>(real.c_str())};
  for (int i = 1; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  std::fflush(stdout);
  std::fflush(stderr);
  // Written before the fork: the child of a process with a thread (Beating) calls only
  // what is safe after a fork (fcntl, execv, write, _exit).
  const std::string cannot_run = fmt::format("{}: error: cannot run {}: ", k_me, real);
  const pid_t pid = ::fork();
  if (pid < 0) {
    fmt::print(stderr, "{}: error: fork: {}\n", k_me, std::strerror(errno));
    return 127;
  }
  if (pid == 0) {
    if (inherit_fd >= 0) ::fcntl(inherit_fd, F_SETFD, 0);
    ::execv(real.c_str(), args.data());
    const char* why = ::strerrordesc_np(errno);  // (glibc's strerror without the locale: safe here)
    (void)!::write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
    if (why) (void)!::write(STDERR_FILENO, why, std::strlen(why));
    (void)!::write(STDERR_FILENO, "\n", 1);
    ::_exit(127);
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Admits the compile against the host's memory ledger (shared with every neffcache
// process on the host; NEFFCACHE_MEM_BUDGET, NEFFCACHE_MEM_LEDGER): waits until `need`
// (at most the whole budget) fits by the scheduler's rule (Admission::fits), saying so once. Returns the reservation (0: no ledger, or the
// deadline passed: the compile runs anyway, as it would without the shim; or `*lost` was
// set: the compile will not run, and its waiting claim must not hold the host's others back).
uint64_t admit(MemoryLedger* ledger, uint64_t need, const std::string& what, SteadyClock::time_point deadline,
               const std::atomic<bool>* lost) {
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
    if (id != 0 || SteadyClock::now() >= deadline || (lost && *lost)) return id;
    if (!said)
      fmt::print(stderr, "{}: waiting for {} of host memory (budget {}) before compiling\n", k_me, format_size(need),
                 format_size(ledger->budget()));
    said = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
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
  const std::string tmp = fmt::format("{}.{}-{}", output, k_me, detail::random_hex64());
  detail::UniqueFd out(::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!out) return sys_error("create", tmp);
  auto copied = detail::copy_hashed(in.get(), neff, out.get(), tmp);
  out.reset();
  if (!copied || ::rename(tmp.c_str(), output.c_str()) != 0) {
    Error err = copied ? sys_error("rename", output) : copied.error();
    ::unlink(tmp.c_str());
    return err;
  }
  return {};
}

[[noreturn]] int fallback(const std::string& real, int argc, char** argv, std::string_view why) {
  fmt::print(stderr, "{}: warning: {}; running {} without the cache\n", k_me, why, real);
  exec_real(real, argc, argv);
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

// The real compiler, run once the host's memory ledger admits what compiles of this
// graph (or graphs of its size) peaked at before; its own peak is recorded after. `alive`
// is kept from the start of the wait for memory, which can be long: a lease or lock left
// unrenewed meanwhile would pass to another process, which would compile the graph too.
// Counted. Returns the compiler's exit status and how long it ran; nothing when the hold
// was lost before the compiler could start (another process compiles the graph now).
std::optional<std::pair<int, double>> compile_admitted(const std::string& real, int argc, char** argv,
                                                       const std::string& backing, const Job& job,
                                                       SteadyClock::time_point deadline, const Keepalive& alive) {
  auto ledger = open_memory_ledger("", "", k_me, [](std::string_view w) { fmt::print(stderr, "{}: warning: {}\n", k_me, w); });
  if (!ledger) fmt::print(stderr, "{}: warning: {}; compiling without the memory budget\n", k_me, ledger.error().message);
  PeakHistory peaks((fs::path(state_dir(backing)) / fs::path(k_peaks_dir).filename()).string());
  const auto predicted = peaks.predict(job.id.str(), job.instructions, job.hlo_bytes);
  int status = 0;
  double seconds = 0;
  {
    const Beating beating(alive);
    const uint64_t reservation =
        admit(ledger ? ledger->get() : nullptr, predicted.bytes, job.entry, deadline, alive.lost);
    if (alive.lost && *alive.lost) {
      if (ledger && *ledger) (*ledger)->release(reservation);
      return std::nullopt;
    }
    const auto start = SteadyClock::now();
    status = run_real(real, argc, argv, alive.inherit_fd);
    seconds = seconds_since(start);
    if (ledger && *ledger) (*ledger)->release(reservation);
  }
  struct rusage children {};
  if (::getrusage(RUSAGE_CHILDREN, &children) == 0 && status == 0)
    peaks.add(job.id.str(), job.instructions, job.hlo_bytes, static_cast<uint64_t>(children.ru_maxrss));
  count(backing, {"compiles"});
  return std::pair(status, seconds);
}

// An s3:// cache: our entry in the bucket holds the identity's result, and every host
// names it alike, so a graph compiled anywhere under any client's name is found there.
// Done: its NEFF is downloaded to the output (whole or not at all). Else its lease is
// taken (waiting while another process or host compiles it, then served as a hit), the
// real compiler runs, and the graph, the NEFF and model.done go up under the lease. An
// S3 we cannot reach costs one warning and a plain compile.
int compile_on_s3(store::S3Store& bucket, const std::string& real, int argc, char** argv, const LnlCommand& call,
                  const Job& job, std::string_view hlo_bytes, const std::vector<std::string>& flags,
                  SteadyClock::time_point t0, SteadyClock::time_point deadline) {
  S3Client& s3 = bucket.client();
  const std::string backing = bucket.name();
  const std::string base = s3_key(bucket.url().prefix, job.entry);
  auto fetched = [&]() -> Result<bool> {  // done on S3: the NEFF is at the output
    auto names = detail::s3_entry_names(s3, base);
    if (!names) return names.error();
    if (!detail::files_named(job.entry, *names).done()) return false;
    if (auto got = s3.download(fmt::format("{}/{}", base, k_neff_file), call.output); !got) return got.error();
    return true;
  };
  auto served = [&](bool waited) {
    say_pass(call, s3.describe(base));
    count(backing, {waited ? "waited" : "hits"});
    return 0;
  };
  auto hit = fetched();
  if (!hit) return fallback(real, argc, argv, hit.error().message);
  if (*hit) return served(false);

  const std::string lease_key = fmt::format("{}/{}", base, EntryFiles::of_entry_path(job.entry).s3_lock_name());
  auto lease = S3Lease::acquire(s3, lease_key);
  std::atomic<bool> lost = false;
  int status = 0;
  // Until the compiler runs under our lease: a lease lost while we waited for memory has
  // another holder, whose NEFF we wait for as for any other (or whose lease we take when
  // it gives up).
  for (;;) {
    for (; !lease && lease.error().code == Errc::busy; lease = S3Lease::acquire(s3, lease_key)) {
      if (SteadyClock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::seconds(1));
      if (hit = fetched(); !hit || *hit) break;
    }
    if (hit && *hit) return served(true);
    if (!hit) return fallback(real, argc, argv, hit.error().message);
    if (!lease) {
      count(backing, {"fallbacks"});
      return fallback(real, argc, argv, lease.error().message);
    }
    // Look again under the lease: whoever held it may have finished.
    if (hit = fetched(); !hit || *hit) {
      lease->finish(hit ? S3Lease::Entry::settled : S3Lease::Entry::open);
      return hit ? served(seconds_since(t0) > 0.05) : fallback(real, argc, argv, hit.error().message);
    }
    // (The renewals' thread is joined before the lease is looked at again.)
    auto ran = compile_admitted(real, argc, argv, backing, job, deadline,
                                {-1, lease->renew_interval(),
                                 [&] {
                                   if (!lost && !lease->renew() && lease->lost()) lost = true;
                                 },
                                 &lost});
    if (ran) {
      status = ran->first;
      break;
    }
    fmt::print(stderr, "{}: warning: {}: the lease passed to another holder while this one waited for memory; "
               "waiting for its NEFF\n", k_me, s3.describe(base));
    lost = false;
    lease = S3Lease::acquire(s3, lease_key);
  }
  struct stat out_st {};
  if (status != 0 || ::stat(call.output.c_str(), &out_st) != 0 || !S_ISREG(out_st.st_mode)) {
    lease->finish(S3Lease::Entry::open);
    return status;
  }
  // Published only while the lease is ours: the graph (flags, then the HLO), then the
  // result as every compile under a lease publishes it (upload_s3_result).
  auto published = [&]() -> Result<void> {
    if (lease->lost()) return Error{Errc::busy, fmt::format("{}: the lease was lost during the compile", s3.describe(base))};
    if (auto r = lease->renew(); !r) return r.error();
    if (auto g = store_s3_graph(s3, bucket.url().prefix, job.entry, hlo_bytes, flags); !g) return g.error();
    auto names = detail::s3_entry_names(s3, base);
    if (!names) return names.error();
    return detail::upload_s3_result(s3, base, detail::files_named(job.entry, *names), call.output);
  }();
  if (!published) {
    fmt::print(stderr, "{}: warning: the NEFF was not cached: {}\n", k_me, published.error().message);
    lease->finish(S3Lease::Entry::open);
    return status;
  }
  lease->finish(S3Lease::Entry::settled);
  return status;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string self = real_path("/proc/self/exe");
  auto real = find_real_compiler(self);
  if (!real) {
    fmt::print(stderr, "{}: error: {}\n", k_me, real.error().message);
    return 127;
  }
  const std::vector<std::string> words(argv, argv + argc);
  auto call = parse_compile_words(words);
  // Not a compile we can read: the real compiler answers, exactly as it would.
  if (!call || call->output.empty()) exec_real(*real, argc, argv);
  if (auto off = process_env("NEFFCACHE_DISABLE"); off && !off->empty() && *off != "0") exec_real(*real, argc, argv);
  if (call->framework != "XLA") return fallback(*real, argc, argv, fmt::format("framework {} is not cached", call->framework));
  // A word that names an existing file besides the input: we may have taken the wrong
  // word for the input. Never key a compile on a guess.
  for (const auto& f : call->flags)
    if (!f.starts_with('-') && f.find('/') != std::string::npos && ::access(f.c_str(), F_OK) == 0)
      return fallback(*real, argc, argv, fmt::format("cannot tell the input among the arguments ({})", f));

  auto cache = store::open_store(caller_cache(*call));
  if (!cache) return fallback(*real, argc, argv, cache.error().message);
  const auto* folder = dynamic_cast<const store::DirectoryStore*>(cache->get());
  auto* bucket = dynamic_cast<store::S3Store*>(cache->get());
  if (!folder && !bucket)
    return fallback(*real, argc, argv, fmt::format("{}: only a folder, a mount or an s3:// cache is served", (*cache)->name()));
  const std::string backing = folder ? folder->backing() : bucket->name();

  auto bytes = detail::read_file(call->input);
  if (!bytes) return fallback(*real, argc, argv, fmt::format("cannot read {}", call->input));
  auto version = compiler_version(*real, backing);
  if (!version) return fallback(*real, argc, argv, version.error().message);
  const std::vector<std::string> flags = lnl_key_flags(*call);
  // The graph is read and hashed once: our key (entry_key's) and the identity both come from it.
  auto hlo = analyze_hlo(*bytes);
  if (!hlo) return fallback(*real, argc, argv, fmt::format("{}: {}", call->input, hlo.error().message));
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
  const Job job{id, entry, hlo->stats.instructions, bytes->size()};
  if (bucket) {
    if (caller_holds_ours) exec_real(*real, argc, argv);
    return compile_on_s3(*bucket, *real, argc, argv, *call, job, *bytes, flags, t0, deadline);
  }
  const std::string entry_dir = fmt::format("{}/{}", folder->root(), entry);
  const ContentIndex* index = folder->content_index();
  if (folder->compiles_on_open()) {
    if (caller_holds_ours) exec_real(*real, argc, argv);
    if (auto done = compile_through_mount(**cache, entry, *bytes, flags, call->output); !done)
      return fallback(*real, argc, argv, done.error().message);
    say_pass(*call, entry);
    return 0;
  }

  // A result known to the index, or our entry done.
  auto lookup = [&]() -> std::optional<Twin> {
    if (auto twin = index->find(id, "", /*with_failures=*/false)) return twin;
    auto files = read_entry_files(entry_dir);
    if (!files || !files->done() || index->knows(entry)) return std::nullopt;
    if (!index->add(id, entry)) return std::nullopt;  // done, but not by a publish of ours
    return index->find(id, "", false);
  };
  auto serve = [&](const Twin& twin, bool waited) -> std::optional<int> {
    if (auto placed = place_output(twin, call->output); !placed) {
      fmt::print(stderr, "{}: warning: {}\n", k_me, placed.error().message);
      return std::nullopt;
    }
    say_pass(*call, twin.record.entry);
    count(backing, {waited ? "waited" : "hits"});
    return 0;
  };
  if (auto twin = lookup())
    if (auto served = serve(*twin, false)) return *served;
  if (auto why = (*cache)->unchangeable()) return fallback(*real, argc, argv, why->message);
  if (caller_holds_ours) exec_real(*real, argc, argv);

  // A miss: our entry's lock, then look again (whoever held it may have compiled it).
  std::error_code ec;
  fs::create_directories(entry_dir, ec);
  if (ec) return fallback(*real, argc, argv, fmt::format("cannot create {}: {}", entry_dir, ec.message()));
  auto lock = EntryLock::acquire(entry_lock_path(entry_dir, EntryFiles::of_entry_path(entry)), deadline);
  if (!lock) {
    count(backing, {"fallbacks"});
    return fallback(*real, argc, argv, lock.error().message);
  }
  const bool waited = seconds_since(t0) > 0.05;
  if (auto twin = lookup())
    if (auto served = serve(*twin, waited)) return *served;

  remove_publish_leftovers(entry_dir);
  // (A lock is never taken over while its heartbeat runs: no `lost`, always an answer.)
  const auto [status, compile_seconds] =
      *compile_admitted(*real, argc, argv, backing, job, deadline,
                        {lock->descriptor(), k_lock_stale_after / 4, [&] { (void)lock->heartbeat(); }});
  struct stat out_st {};
  if (status != 0 || ::stat(call->output.c_str(), &out_st) != 0 || !S_ISREG(out_st.st_mode)) {
    lock->release();
    ::rmdir(entry_dir.c_str());  // (only when nothing else is in it)
    return status;
  }
  // Our entry: the graph and flags, then the NEFF, published; then the index record.
  auto stored = store_graph(entry_dir, *bytes, flags);
  nlohmann::ordered_json meta{{"compiler_version", *version}, {"compile_seconds", compile_seconds}, {"by", k_me}};
  auto published = stored ? detail::publish(entry_dir, call->output, meta) : Result<std::string>(stored.error());
  if (!published) {
    fmt::print(stderr, "{}: warning: the NEFF was not cached: {}\n", k_me, published.error().message);
    return status;
  }
  if (auto r = index->add(id, entry, compile_seconds); !r)
    fmt::print(stderr, "{}: warning: the content index did not record {}: {}\n", k_me, entry, r.error().message);
  return status;
}
