// Memory admission (issue 20 item 6): a batch of graphs whose compiles peak at very
// different sizes, compiled by `neffcache compile` inside a real memory cgroup that
// stands for a host, by ours (admission by predicted peak against a memory budget)
// and by two fixed counts of compiles at once, side by side in each repetition.
//
// The host: a memory cgroup this benchmark creates for each run and removes after it
// (killing whatever is left in it first, also on failure or SIGINT/SIGTERM): cgroup v2
// where its hierarchy has the memory controller (memory.max, memory.swap.max = 0),
// else v1 (memory.limit_in_bytes, memory.memsw.limit_in_bytes too when present). A run
// is started as `sh -c 'echo $$ > CG/cgroup.procs && exec neffcache compile ...'`, so
// the cgroup holds that run and its compilers and never this process. Needs root; a
// row says why when it is skipped.
//
// The workload, chosen before any measurement: --graphs (40) synthesized modules whose
// fake compiles peak from 5% to 60% of the cgroup's limit (--limit-mib, 1536), spread
// log-uniformly (geometric steps), the shape of the real range (10 GB to 175 GB per
// compile, a public compile farm on SDK 2.27-2.32) with the largest at 60%. Each module
// is a chain of instructions: fake-neuronx-cc touches --kib-per-instruction (64) KiB per
// instruction in a forked child held for the whole compile
// (NEFFCACHE_FAKE_MEMORY_CHILD, NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION) and sleeps
// instructions / --rate (3000) seconds (NEFFCACHE_FAKE_IDLE, as a compiler on cores of
// its own), so time and peak are both in proportion to the graph: 77 MiB / 0.4 s to
// 922 MiB / 4.9 s by default, 73 s of compiling in all. The rate was chosen for one
// repetition of the four runs to take 2-3 minutes, estimated before measuring: -j 2
// about 37 s, -j 5 about 15 s plus what OOM kills cost, ours with peaks known about
// 30 s (sum of peak x time / budget, with headroom), ours while learning up to the
// 73 s of one compile at a time.
// Until the fake compiler has those knobs, this program stands in for them
// (--fake-memory emulated: it runs the fake compiler and a child of its own that holds
// the memory; a SIGKILLed child makes it print [F137] and exit 70, as neuronx-cc does).
//
// The contenders, in alternating order (ours and its second batch stay together):
// - ours: `neffcache compile` with the default budget (85% of the cgroup's limit), a
//   fresh cache, ledger and history, so peaks are learned during the run; -j is the
//   number of graphs, so that memory alone bounds it (--jobs is an upper bound);
// - ours with peaks known: a second batch of the same graphs into a fresh cache given
//   the first run's learned history (its .neffcache/memory/ folder);
// - the Neuron tool's rule: `--mem-budget off -j S`, S = ceil(limit / slot), the slot
//   being 64 GiB scaled as the peaks are (175 GB -> 60% of the limit puts 64 GiB at
//   23.6% of it): S = 5 at any limit;
// - one slot per core: `--mem-budget off -j $(nproc)`.
// No retries are asked for (NEURON_PARALLEL_COMPILE_MAX_RETRIES unset): a fixed-slot
// run loses what the kernel kills unless the tool retries it on its own.
//
// Rows: makespan of ours / each fixed-slot makespan (goal <= 0.67, 1.5x the
// throughput); as a run that loses compiles ends sooner, also the throughput (nominal
// compile seconds of the entries done, per second) of ours / each; the kernel's OOM
// kills in each run's cgroup (goal 0 for ours), entries done of all, NEFFs whole (each
// done entry's model.neff against the size and xxh3 recorded at publication, and the
// fake NEFF's own checksum and graph), and the cgroup's peak memory / its limit.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <neffcache/neffcache.hpp>

#include "fake_neff.hpp"
#include "synth.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace neffcache;
using Clock = std::chrono::steady_clock;

constexpr double k_smallest_share = 0.05;              // of the limit: the smallest peak
constexpr double k_largest_share = 0.60;               // and the largest
constexpr double k_real_largest_peak = 175e9;          // bytes, the largest real compile
constexpr double k_neuron_slot = 64.0 * (1ull << 30);  // bytes, the Neuron tool's slot
constexpr std::string_view k_cgroup_prefix = "neffcache-bench-memory-";
constexpr std::string_view k_as_fake = "--as-fake-compiler";
constexpr std::string_view k_kib_knob = "NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION";
constexpr auto k_poll = std::chrono::milliseconds(10);
constexpr auto k_cleanup_patience = std::chrono::seconds(10);

volatile std::sig_atomic_t g_stop = 0;  // SIGINT, SIGTERM or SIGHUP arrived

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Writes `text` to a cgroup control file; throws with the file's name on failure.
void put(const fs::path& file, const std::string& text) {
  int fd = ::open(file.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("cannot open {}: {}", file.string(), std::strerror(errno)));
  ssize_t n = ::write(fd, text.data(), text.size());
  int err = errno;
  ::close(fd);
  if (n != static_cast<ssize_t>(text.size()))
    throw std::runtime_error(fmt::format("cannot write '{}' to {}: {}", text, file.string(), std::strerror(err)));
}

// The number after `key` on a line of a flat-keyed file (memory.events, memory.oom_control).
uint64_t keyed(const fs::path& file, std::string_view key) {
  std::istringstream in(slurp(file));
  for (std::string k; in >> k;) {
    uint64_t v = 0;
    if (!(in >> v)) break;
    if (k == key) return v;
  }
  return 0;
}

uint64_t number_in(const fs::path& file) {
  std::error_code ec;
  if (!fs::exists(file, ec)) return 0;
  std::string text = slurp(file);
  return std::strtoull(text.c_str(), nullptr, 10);
}

enum class CgroupVersion { v1, v2 };

// Where memory cgroups are made: the mount of a v2 hierarchy that has the memory
// controller, else of the v1 memory hierarchy.
struct Hierarchy {
  CgroupVersion version;
  fs::path root;
};

std::optional<Hierarchy> memory_hierarchy(std::string& why) {
  std::istringstream mounts(slurp("/proc/self/mounts"));
  std::optional<Hierarchy> v1, v2;
  for (std::string line; std::getline(mounts, line);) {
    std::istringstream f(line);
    std::string dev, at, type, options;
    f >> dev >> at >> type >> options;
    if (type == "cgroup2" && !v2) {
      std::istringstream controllers(slurp(fs::path(at) / "cgroup.controllers"));
      for (std::string c; controllers >> c;)
        if (c == "memory") v2 = Hierarchy{CgroupVersion::v2, at};
    } else if (type == "cgroup" && !v1 && ("," + options + ",").find(",memory,") != std::string::npos) {
      v1 = Hierarchy{CgroupVersion::v1, at};
    }
  }
  if (!v2 && !v1) why = "no memory cgroup: neither a cgroup v2 hierarchy with the memory controller nor v1 memory";
  return v2 ? v2 : v1;
}

// The pids in a cgroup's cgroup.procs (none for a missing cgroup).
std::vector<pid_t> members(const fs::path& cg) {
  std::istringstream in(slurp(cg / "cgroup.procs"));
  std::vector<pid_t> pids;
  for (pid_t p; in >> p;) pids.push_back(p);
  return pids;
}

// Kills what is left in a cgroup (all of it ours: only what this program started
// enters one) and removes it. Best effort: says on stderr what it could not remove.
void kill_and_remove(const fs::path& cg) noexcept {
  try {
    const auto deadline = Clock::now() + k_cleanup_patience;
    for (;;) {
      auto pids = members(cg);
      if (pids.empty() || Clock::now() > deadline) break;
      for (pid_t p : pids) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(k_poll);
    }
    // rmdir is refused (EBUSY) until the last member has been reaped.
    while (::rmdir(cg.c_str()) != 0 && errno != ENOENT) {
      if (Clock::now() > deadline) {
        fmt::print(stderr, "bench_memory: could not remove {}: {}\n", cg.string(), std::strerror(errno));
        return;
      }
      std::this_thread::sleep_for(k_poll);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_memory: cleaning up {}: {}\n", cg.string(), e.what());
  }
}

// A memory cgroup of its own for one run, removed (its leftovers killed) when this
// handle is destroyed. Move-only.
class MemoryCgroup {
 public:
  // Creates `name` under the hierarchy with the limit (and no swap). Throws, leaving
  // nothing behind, when a control file refuses.
  static MemoryCgroup create(const Hierarchy& h, const std::string& name, uint64_t limit) {
    if (h.version == CgroupVersion::v2) {
      // The controller must be on in the parent for the child to have memory.max. It is
      // left on: other cgroups of the root may rely on it by then.
      std::istringstream on(slurp(h.root / "cgroup.subtree_control"));
      bool enabled = false;
      for (std::string c; on >> c;) enabled = enabled || c == "memory";
      if (!enabled) put(h.root / "cgroup.subtree_control", "+memory");
    }
    MemoryCgroup cg(h, h.root / name);
    if (::mkdir(cg.path_.c_str(), 0755) != 0)
      throw std::runtime_error(fmt::format("cannot create {}: {}", cg.path_.string(), std::strerror(errno)));
    cg.owned_ = true;
    if (h.version == CgroupVersion::v2) {
      put(cg.path_ / "memory.max", std::to_string(limit));
      if (fs::exists(cg.path_ / "memory.swap.max")) put(cg.path_ / "memory.swap.max", "0");
    } else {
      put(cg.path_ / "memory.limit_in_bytes", std::to_string(limit));
      // memsw (memory + swap) may not be lower than the memory limit: set after it.
      if (fs::exists(cg.path_ / "memory.memsw.limit_in_bytes"))
        put(cg.path_ / "memory.memsw.limit_in_bytes", std::to_string(limit));
    }
    return cg;
  }

  MemoryCgroup(MemoryCgroup&& o) noexcept : h_(o.h_), path_(o.path_), owned_(std::exchange(o.owned_, false)) {}
  MemoryCgroup& operator=(MemoryCgroup&&) = delete;
  MemoryCgroup(const MemoryCgroup&) = delete;
  ~MemoryCgroup() {
    if (owned_) kill_and_remove(path_);
  }

  fs::path procs() const { return path_ / "cgroup.procs"; }
  // Processes the kernel's OOM killer killed in this cgroup.
  uint64_t oom_kills() const {
    return h_.version == CgroupVersion::v2 ? keyed(path_ / "memory.events", "oom_kill")
                                           : keyed(path_ / "memory.oom_control", "oom_kill");
  }
  // The most it held at once, bytes (0 when the kernel does not say: v2 before 5.19).
  uint64_t peak() const {
    return number_in(path_ / (h_.version == CgroupVersion::v2 ? "memory.peak" : "memory.max_usage_in_bytes"));
  }

 private:
  MemoryCgroup(const Hierarchy& h, fs::path p) : h_(h), path_(std::move(p)) {}
  Hierarchy h_;
  fs::path path_;
  bool owned_ = false;
};

// Cgroups left by an earlier run of this program that died without cleaning up (its
// pid is gone): their processes are killed and they are removed.
void remove_stale_cgroups(const Hierarchy& h) {
  std::error_code ec;
  for (const auto& d : fs::directory_iterator(h.root, ec)) {
    const std::string name = d.path().filename().string();
    if (!name.starts_with(k_cgroup_prefix)) continue;
    const int owner = std::atoi(name.c_str() + k_cgroup_prefix.size());
    if (owner > 0 && (::kill(owner, 0) == 0 || errno != ESRCH)) continue;  // its owner still runs
    fmt::print(stderr, "bench_memory: removing {} left by a run that died\n", d.path().string());
    kill_and_remove(d.path());
  }
}

// --fake-memory emulated: `bench_memory --as-fake-compiler HLO FAKE ARGS...` stands in
// for the fake compiler's NEFFCACHE_FAKE_MEMORY_CHILD and _KIB_PER_INSTRUCTION: a
// forked child touches instructions x N KiB and holds it while FAKE ARGS... runs; if
// the kernel kills the child, the compiler is killed too and this prints [F137] and
// exits 70, as neuronx-cc does when its own child is OOM-killed.
int emulated_fake_compiler(int argc, char** argv) {
  if (argc < 4) return fmt::print(stderr, "usage: {} {} HLO COMPILER ARGS...\n", argv[0], k_as_fake), 2;
  auto hlo = analyze_hlo_file(argv[2]);
  if (!hlo) return fmt::print(stderr, "ERROR: {}\n", hlo.error().message), 1;
  const char* kib = std::getenv(std::string(k_kib_knob).c_str());
  const std::size_t bytes = hlo->stats.instructions * (kib ? std::strtoull(kib, nullptr, 10) : 0) * 1024;
  pid_t hog = -1;
  if (bytes > 0 && (hog = ::fork()) == 0) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) ::_exit(1);
    for (std::size_t i = 0; i < bytes; i += 4096) static_cast<volatile char*>(p)[i] = 1;
    for (;;) ::pause();
  }
  if (hog < 0 && bytes > 0) return fmt::print(stderr, "ERROR: fork: {}\n", std::strerror(errno)), 1;
  pid_t compiler = -1;
  if (int err = ::posix_spawn(&compiler, argv[3], nullptr, nullptr, argv + 3, environ); err != 0) {
    if (hog > 0) ::kill(hog, SIGKILL), ::waitpid(hog, nullptr, 0);
    return fmt::print(stderr, "ERROR: cannot run {}: {}\n", argv[3], std::strerror(err)), 1;
  }
  for (;;) {
    int status = 0;
    pid_t who = ::waitpid(-1, &status, 0);
    if (who < 0 && errno == EINTR) continue;
    if (who == hog) {
      ::kill(compiler, SIGKILL);
      ::waitpid(compiler, nullptr, 0);
      if (WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
        fmt::print("[F137] neuronx-cc was forcibly killed - This most commonly occurs due to insufficient system "
                   "memory. Using a smaller data type, dimensions, batch size, or a larger instance type may help.\n");
        return 70;
      }
      return fmt::print(stderr, "ERROR: the memory child ended ({:#x})\n", status), 1;
    }
    if (who == compiler) {
      if (hog > 0) ::kill(hog, SIGKILL), ::waitpid(hog, nullptr, 0);
      if (WIFSIGNALED(status)) ::signal(WTERMSIG(status), SIG_DFL), ::raise(WTERMSIG(status));
      return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    }
    if (who < 0) return fmt::print(stderr, "ERROR: waitpid: {}\n", std::strerror(errno)), 1;
  }
}

struct Graph {
  std::string hlo;
  std::string canonical_sha256;
  uint64_t instructions = 0;
};

struct Workload {
  std::vector<Graph> graphs;
  uint64_t kib_per_instruction = 0;
  double rate = 0;
  double peak_mib(const Graph& g) const { return g.instructions * kib_per_instruction / 1024.0; }
  double seconds(const Graph& g) const { return g.instructions / rate; }
};

Workload make_workload(int graphs, uint64_t limit_mib, uint64_t kib_per_instruction, double rate) {
  Workload w{{}, kib_per_instruction, rate};
  const double low = k_smallest_share * limit_mib * 1024, high = k_largest_share * limit_mib * 1024;  // KiB
  for (int k = 0; k < graphs; ++k) {
    const double peak = low * std::pow(high / low, k / double(std::max(1, graphs - 1)));
    Graph g;
    g.hlo = bench::chain_module(peak / kib_per_instruction);
    auto a = analyze_hlo(g.hlo).value();
    g.canonical_sha256 = a.canonical_sha256;
    g.instructions = a.stats.instructions;
    w.graphs.push_back(std::move(g));
  }
  return w;
}

// A fresh cache holding the workload; returns each graph's entry folder.
std::vector<std::string> make_cache(const fs::path& root, const Workload& w) {
  std::vector<std::string> entries;
  for (const auto& g : w.graphs) {
    auto entry = make_entry_folder(root.string(), entry_key(g.hlo, {}, "2.21.0").value()).value();
    (void)store_graph(entry, g.hlo, {}).value();
    entries.push_back(entry);
  }
  return entries;
}

enum class Contender { ours, ours_known, neuron_rule, per_core };

struct Outcome {
  double makespan = 0;
  uint64_t oom_kills = 0;
  double peak_share = 0;  // of the limit; 0 unknown
  int done = 0;           // entries with model.done
  int whole = 0;          // of them, with a whole NEFF of the right graph
  double done_seconds = 0;  // the nominal compile time of the done entries
};

// Done and whole entries of a run's cache.
void check_cache(const std::vector<std::string>& entries, const Workload& w, Outcome& out) {
  for (std::size_t i = 0; i < entries.size(); ++i) {
    std::error_code ec;
    if (!fs::exists(fmt::format("{}/{}", entries[i], k_done_file), ec)) continue;
    ++out.done;
    out.done_seconds += w.seconds(w.graphs[i]);
    if (verify_neff(entries[i]).check != NeffCheck::ok) continue;
    auto bytes = detail::read_file(fmt::format("{}/{}", entries[i], k_neff_file));
    auto neff = bytes ? fake::parse_fake_neff(*bytes) : std::nullopt;
    if (neff && neff->graph == w.graphs[i].canonical_sha256) ++out.whole;
  }
}

// Runs `neffcache compile --cache CACHE ARGS...` inside a fresh memory cgroup, its
// output in LOG; the cgroup is gone when this returns or throws.
Outcome run_in_cgroup(const Hierarchy& h, uint64_t limit, const fs::path& cache, const std::vector<std::string>& args,
                      const fs::path& log, double timeout) {
  static int serial = 0;
  auto cg = MemoryCgroup::create(h, fmt::format("{}{}-{}", k_cgroup_prefix, ::getpid(), serial++), limit);
  std::vector<std::string> argv = {"/bin/sh", "-c", "echo $$ > \"$0\" && exec \"$@\"", cg.procs().string(),
                                   NEFFCACHE_TOOL, "compile", "--cache", cache.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  cargv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const auto t0 = Clock::now();
  int err = ::posix_spawn(&pid, argv[0].c_str(), &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) throw std::runtime_error(fmt::format("cannot run /bin/sh: {}", std::strerror(err)));
  int status = 0;
  bool stopped = false, late = false;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    if ((g_stop || since(t0) > timeout) && !stopped) {
      stopped = true, late = !g_stop;
      for (pid_t p : members(cg.procs().parent_path())) ::kill(p, SIGKILL);
    }
    std::this_thread::sleep_for(k_poll);
  }
  Outcome out;
  out.makespan = since(t0);
  out.oom_kills = cg.oom_kills();
  out.peak_share = cg.peak() / double(limit);
  if (g_stop) throw std::runtime_error("stopped by a signal");
  if (late) throw std::runtime_error(fmt::format("a run took over {} s; its output is in {}", timeout, log.string()));
  const std::string text = slurp(log);
  if (text.find("Total graphs:") == std::string::npos)
    throw std::runtime_error(fmt::format("neffcache compile ended ({:#x}) without its report:\n{}", status,
                                         text.substr(text.size() > 2000 ? text.size() - 2000 : 0)));
  return out;
}

std::string contender_name(Contender c, int neuron_slots, int cores) {
  switch (c) {
    case Contender::ours: return "ours";
    case Contender::ours_known: return "ours, peaks known";
    case Contender::neuron_rule: return fmt::format("Neuron rule (-j {})", neuron_slots);
    case Contender::per_core: return fmt::format("one per core (-j {})", cores);
  }
  return "";
}

bool tool_has_memory_admission() {
  auto r = detail::run_capture({NEFFCACHE_TOOL, "compile", "--help"}, std::chrono::seconds(30));
  return r && r->output.find("--mem-budget") != std::string::npos;
}

bool fake_has_memory_knobs() {
  return slurp(NEFFCACHE_FAKE_COMPILER).find(k_kib_knob) != std::string::npos;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void print_header() {
  fmt::print("| benchmark | median | min | max | unit | runs | goal | met |\n|---|---:|---:|---:|---|---:|---|---|\n");
}

// One row: median, min and max of `v`; `goal` is met when `met(median, min, max)`.
template <typename Met>
void row(const std::string& what, std::vector<double> v, const std::string& unit, const std::string& goal, Met met) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  const double m = median(v);
  fmt::print("| {} | {:.3g} | {:.3g} | {:.3g} | {} | {} | {} | {} |\n", what, m, v.front(), v.back(), unit, v.size(), goal,
             goal.empty() ? "" : met(m, v.front(), v.back()) ? "yes" : "**no**");
}

void row(const std::string& what, std::vector<double> v, const std::string& unit) {
  row(what, std::move(v), unit, "", [](double, double, double) { return true; });
}

void skipped(const std::string& why) {
  print_header();
  fmt::print("| memory admission: skipped, {} | | | | | 0 | | |\n", why);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && argv[1] == k_as_fake) return emulated_fake_compiler(argc, argv);

  int reps = 3, graphs = 40, ours_jobs = 0;
  uint64_t limit_mib = 1536, kib_per_instruction = 64;
  double rate = 3000, run_timeout = 900;
  std::string fake_memory = "auto", work_dir = "/var/tmp";
  CLI::App app{"bench_memory: compiles admitted by memory against fixed counts, in a memory cgroup (root)"};
  app.add_option("--reps", reps, "repetitions")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--graphs", graphs, "graphs in the batch")->capture_default_str()->check(CLI::Range(2, 10000));
  app.add_option("--limit-mib", limit_mib, "the cgroup's memory limit, MiB")->capture_default_str()->check(CLI::Range(64, 1 << 30));
  app.add_option("--kib-per-instruction", kib_per_instruction, "fake compiler's memory per instruction, KiB")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--rate", rate, "fake-neuronx-cc instructions per second")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--ours-jobs", ours_jobs, "-j of ours (0: the number of graphs)")->capture_default_str();
  app.add_option("--fake-memory", fake_memory,
                 "how compiles hold memory: native (the fake compiler's knobs), emulated (this program stands in "
                 "for them), auto (native when the fake compiler has them)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "native", "emulated"}));
  app.add_option("--run-timeout", run_timeout, "seconds before a run is stopped as a failure")->capture_default_str();
  app.add_option("--dir", work_dir, "where the caches are made")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (::geteuid() != 0) return skipped("needs root (it creates a memory cgroup)"), 0;
  std::string why;
  auto hierarchy = memory_hierarchy(why);
  if (!hierarchy) return skipped(why), 0;
  remove_stale_cgroups(*hierarchy);
  try {
    // A probe, so that a hierarchy that refuses (a container's, with processes in its
    // root) gives a row that says why rather than a failure.
    (void)MemoryCgroup::create(*hierarchy, fmt::format("{}{}-probe", k_cgroup_prefix, ::getpid()), 64 << 20);
  } catch (const std::exception& e) {
    return skipped(fmt::format("cannot make a memory cgroup ({})", e.what())), 0;
  }

  const uint64_t limit = limit_mib << 20;
  const int neuron_slots =
      static_cast<int>(std::ceil(k_real_largest_peak / (k_largest_share * k_neuron_slot) - 1e-9));  // limit / slot
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  if (ours_jobs <= 0) ours_jobs = graphs;
  const bool admission = tool_has_memory_admission();
  const bool native = fake_memory == "native" || (fake_memory == "auto" && fake_has_memory_knobs());

  for (const char* v : {"NEURON_CC_FLAGS", "NEURON_PARALLEL_COMPILE_MAX_RETRIES", "NEURON_PARALLEL_COMPILE_DUMP_RESULTS",
                        "NEFFCACHE_FAKE_MEMORY_MB", "NEFFCACHE_FAKE_SECONDS", "NEFFCACHE_FAKE_FAIL", "NEFFCACHE_FAKE_ONLY",
                        "NEFFCACHE_FAKE_SIGNAL", "NEFFCACHE_FAKE_SIGNAL_ONCE", "NEFFCACHE_FAKE_HANG",
                        "NEFFCACHE_FAKE_NEFF_BYTES", "NEFFCACHE_FAKE_LOG", "NEFFCACHE_FAKE_EXCLUSIVE_DIR"})
    ::unsetenv(v);
  ::setenv("NEFFCACHE_FAKE_RATE", fmt::format("{}", rate).c_str(), 1);
  ::setenv("NEFFCACHE_FAKE_IDLE", "1", 1);
  ::setenv("NEFFCACHE_FAKE_MEMORY_CHILD", "1", 1);
  ::setenv(std::string(k_kib_knob).c_str(), std::to_string(kib_per_instruction).c_str(), 1);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, [](int) { g_stop = 1; });

  const std::string fake_args = " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}";
  const std::string compiler =
      native ? NEFFCACHE_FAKE_COMPILER + fake_args
             : fmt::format("{} {} {{hlo}} {}{}", fs::read_symlink("/proc/self/exe").string(), k_as_fake,
                           NEFFCACHE_FAKE_COMPILER, fake_args);

  const Workload workload = make_workload(graphs, limit_mib, kib_per_instruction, rate);
  double total_seconds = 0;
  for (const auto& g : workload.graphs) total_seconds += workload.seconds(g);
  fmt::print(stderr, "bench_memory: cgroup {} under {}, {} graphs peaking {:.0f}-{:.0f} MiB of {} MiB, {:.2g}-{:.2g} s each, "
             "{:.0f} s in all; compiles hold memory {}; neffcache compile {} --mem-budget\n",
             hierarchy->version == CgroupVersion::v2 ? "v2" : "v1", hierarchy->root.string(), graphs,
             workload.peak_mib(workload.graphs.front()), workload.peak_mib(workload.graphs.back()), limit_mib,
             workload.seconds(workload.graphs.front()), workload.seconds(workload.graphs.back()), total_seconds,
             native ? "natively (the fake compiler's knobs)" : "by emulation (this program)",
             admission ? "has" : "has no");

  std::string work = (fs::path(work_dir) / "neffcache-memory-XXXXXX").string();
  if (!::mkdtemp(work.data())) return fmt::print(stderr, "bench_memory: cannot create {}\n", work), 1;
  std::map<Contender, std::vector<Outcome>> results;
  bool learned = true;  // the first run left a .neffcache/memory/ folder
  try {
    for (int r = 0; r < reps; ++r) {
      std::vector<Contender> order = {Contender::ours, Contender::neuron_rule, Contender::per_core};
      if (r % 2) std::reverse(order.begin(), order.end());
      fs::path first_cache;  // ours' cache of this repetition
      for (Contender c : order)
        for (Contender run : c == Contender::ours ? std::vector{c, Contender::ours_known} : std::vector{c}) {
          if (run == Contender::ours_known && !(learned = fs::exists(first_cache / ".neffcache/memory"))) continue;
          const fs::path dir = fs::path(work) / fmt::format("rep{}-{}", r, static_cast<int>(run));
          const fs::path cache = dir / "cache";
          fs::create_directories(dir);
          auto entries = make_cache(cache, workload);
          std::vector<std::string> args = {"--compiler", compiler};
          if (run == Contender::ours || run == Contender::ours_known) {
            args.insert(args.end(), {"-j", std::to_string(ours_jobs)});
          } else {
            const int jobs = run == Contender::neuron_rule ? neuron_slots : cores;
            args.insert(args.end(), {"-j", std::to_string(jobs)});
            if (admission) args.insert(args.end(), {"--mem-budget", "off"});
          }
          if (admission) args.insert(args.end(), {"--mem-ledger", (dir / "ledger").string()});
          if (run == Contender::ours) first_cache = cache;
          if (run == Contender::ours_known)
            fs::create_directories(cache / ".neffcache"),
                fs::copy(first_cache / ".neffcache/memory", cache / ".neffcache/memory", fs::copy_options::recursive);
          Outcome o = run_in_cgroup(*hierarchy, limit, cache, args, dir / "output.log", run_timeout);
          check_cache(entries, workload, o);
          fmt::print(stderr, "bench_memory: rep {} {}: {:.1f} s, {} OOM kills, {} of {} done ({} whole), peak {:.0f}% of the limit\n",
                     r, contender_name(run, neuron_slots, cores), o.makespan, o.oom_kills, o.done, graphs, o.whole,
                     o.peak_share * 100);
          results[run].push_back(o);
        }
      for (const auto& d : fs::directory_iterator(work)) fs::remove_all(d.path());
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_memory: {}\n", e.what());
    fs::remove_all(work);
    return 1;
  }
  fs::remove_all(work);

  auto of = [&](Contender c, auto f) {
    std::vector<double> v;
    for (const auto& o : results[c]) v.push_back(f(o));
    return v;
  };
  // Of two contenders' runs in the same repetitions.
  auto ratio = [&](Contender a, Contender b, auto f) {
    std::vector<double> v;
    for (std::size_t i = 0; i < std::min(results[a].size(), results[b].size()); ++i)
      v.push_back(f(results[a][i]) / f(results[b][i]));
    return v;
  };
  auto makespan = [](const Outcome& o) { return o.makespan; };
  auto throughput = [](const Outcome& o) { return o.done_seconds / o.makespan; };
  const std::string ours_note = admission ? "" : " (this build has no memory admission)";
  const std::string batch = fmt::format("{} graphs in a {} MiB cgroup", graphs, limit_mib);
  print_header();
  const std::vector<Contender> fixed = {Contender::neuron_rule, Contender::per_core};
  for (Contender f : fixed)
    row(fmt::format("memory: makespan of {}, ours{} / {}", batch, ours_note, contender_name(f, neuron_slots, cores)),
        ratio(Contender::ours, f, makespan), "ratio", "<= 0.67",
        [](double median, double, double) { return median <= 0.67; });
  for (Contender f : fixed)
    row(fmt::format("memory: the same, ours with peaks known / {}", contender_name(f, neuron_slots, cores)),
        ratio(Contender::ours_known, f, makespan), "ratio");
  for (Contender f : fixed)
    row(fmt::format("memory: throughput (compile seconds of the done entries per second), ours / {}",
                    contender_name(f, neuron_slots, cores)),
        ratio(Contender::ours, f, throughput), "ratio");
  for (Contender c : {Contender::ours, Contender::ours_known, Contender::neuron_rule, Contender::per_core})
    row(fmt::format("memory: makespan, {}", contender_name(c, neuron_slots, cores)),
        of(c, makespan), "s");
  for (Contender c : {Contender::ours, Contender::ours_known, Contender::neuron_rule, Contender::per_core}) {
    const bool goal = c == Contender::ours || c == Contender::ours_known;
    row(fmt::format("memory: kernel OOM kills, {}", contender_name(c, neuron_slots, cores)),
        of(c, [](const Outcome& o) { return double(o.oom_kills); }), "count", goal ? "0" : "",
        [](double, double, double most) { return most == 0; });
  }
  for (Contender c : {Contender::ours, Contender::ours_known, Contender::neuron_rule, Contender::per_core}) {
    const bool goal = c == Contender::ours || c == Contender::ours_known;
    row(fmt::format("memory: entries done of {}, {}", graphs, contender_name(c, neuron_slots, cores)),
        of(c, [](const Outcome& o) { return double(o.done); }), "count", goal ? fmt::format("= {}", graphs) : "",
        [&](double, double least, double) { return least == graphs; });
  }
  std::vector<double> broken;
  for (const auto& [c, outcomes] : results)
    for (const auto& o : outcomes) broken.push_back(o.done - o.whole);
  row("memory: done entries whose NEFF is not whole, all runs", broken, "count", "0",
      [](double, double, double most) { return most == 0; });
  for (Contender c : {Contender::ours, Contender::ours_known, Contender::neuron_rule, Contender::per_core})
    if (!results[c].empty() && results[c].front().peak_share > 0)
      row(fmt::format("memory: the cgroup's peak / its limit, {}", contender_name(c, neuron_slots, cores)),
          of(c, [](const Outcome& o) { return o.peak_share; }), "ratio");
  if (!learned)
    fmt::print("| memory: ours with peaks known: not measured, this build keeps no learned peaks (.neffcache/memory/) "
               "| | | | | 0 | | |\n");
  return 0;
}
