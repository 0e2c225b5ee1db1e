// Memory admission (issue 20 item 6): batches of graphs compiled by `neffcache compile`
// inside a real memory cgroup that stands for a host, by ours (admission by predicted
// peak against a memory budget) and by fixed counts of compiles at once, side by side in
// each repetition. Two batches: a mixed one whose compiles peak at very different sizes
// (below), and a small one, the common case of the real range.
//
// The host: a memory cgroup this benchmark creates for each run and removes after it
// (killing whatever is left in it first, also on failure or SIGINT/SIGTERM), the
// tests' own (tests/support/cgroup.hpp): cgroup v2 where its hierarchy has the memory
// controller (memory.max, memory.swap.max = 0), else v1 (memory.limit_in_bytes,
// memory.memsw.limit_in_bytes too when present). A run is started as
// `sh -c 'echo $$ > CG/cgroup.procs && exec neffcache compile ...'`, so the cgroup
// holds that run and its compilers and never this process. Needs root; a row says why
// when it is skipped.
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
// No retries are asked for (NEURON_PARALLEL_COMPILE_MAX_RETRIES unset). neffcache
// compile retries an OOM-killed compile on its own (up to 3 times, with a larger
// reservation), also with --mem-budget off, so a fixed-slot run loses an entry only
// when the same compile is killed 4 times.
//
// The small batch (--small-graphs, 80; 0 leaves it out): the cgroup (--small-limit-mib,
// 4096) stands for a trn1.32xlarge of 512 GiB and the graphs peak at 10 to 20 GB of it
// (74 to 149 MiB; at 1536 MiB the fake compiler's own 11 MiB would be a third of each
// peak), 1.5 to 3 s each (--small-rate, 800). Contenders: ours, and the Neuron tool's
// rule on that host, ceil(512 GiB / 64 GiB) = 8 at once, which holds 64 GiB for each
// compile of 10 to 20 GB: the waste that admission by memory is for.
//
// On the mixed batch, the 0.67 goal cannot be met on a 2-core machine whatever the
// admission: one slot per core is 2 at once there, and the mixed batch's memory-time
// (each peak with ours' 20% headroom, times its time, summed) over ours' budget (85% of
// the limit) is already 0.94 of what 2 slots take with no OOM kill at all.
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

#include "cgroup.hpp"
#include "paths.hpp"
#include "fake_neff.hpp"
#include "synth.hpp"

extern char** environ;

namespace {

namespace fs = std::filesystem;
using namespace neffcache;
using Clock = std::chrono::steady_clock;

constexpr double k_smallest_share = 0.05;              // of the limit: the smallest peak
constexpr double k_largest_share = 0.60;               // and the largest
// The small batch: the cgroup stands for a trn1.32xlarge (512 GiB), whose Neuron pool is
// 8 compiles of 64 GiB, and the graphs peak at 10 to 20 GB each, the common case of the
// real range (2% to 4% of the host).
constexpr double k_host_bytes = 512.0 * (1ull << 30);
constexpr double k_small_low_share = 10e9 / k_host_bytes, k_small_high_share = 20e9 / k_host_bytes;
constexpr double k_real_largest_peak = 175e9;          // bytes, the largest real compile
constexpr double k_neuron_slot = 64.0 * (1ull << 30);  // bytes, the Neuron tool's slot
constexpr auto k_poll = std::chrono::milliseconds(10);

volatile std::sig_atomic_t g_stop = 0;  // SIGINT, SIGTERM or SIGHUP arrived

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
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

// `graphs` graphs whose peaks go from `low_share` to `high_share` of the limit in
// geometric steps.
Workload make_workload(int graphs, uint64_t limit_mib, double low_share, double high_share,
                       uint64_t kib_per_instruction, double rate) {
  Workload w{{}, kib_per_instruction, rate};
  const double low = low_share * limit_mib * 1024, high = high_share * limit_mib * 1024;  // KiB
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

// One way of compiling a batch: ours (admission by memory, -j only an upper bound), or a
// fixed count of compiles at once (--mem-budget off).
struct Contender {
  std::string name;
  int jobs = 1;
  bool ours = false;
  bool known = false;  // ours, given the peaks that this repetition's first run of ours learned
};

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
Outcome run_in_cgroup(uint64_t limit, const fs::path& cache, const std::vector<std::string>& args, const fs::path& log,
                      double timeout) {
  std::string why;
  auto cg = test::MemoryCgroup::create(limit, why);
  if (!cg) throw std::runtime_error(fmt::format("cannot make a memory cgroup: {}", why));
  std::vector<std::string> argv = {test::path::tool, "compile", "--cache", cache.string()};
  argv.insert(argv.end(), args.begin(), args.end());
  argv = cg->wrap(argv);
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
  int err = ::posix_spawnp(&pid, argv[0].c_str(), &fa, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  if (err != 0) throw std::runtime_error(fmt::format("cannot run sh: {}", std::strerror(err)));
  int status = 0;
  bool stopped = false, late = false;
  for (;;) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    if ((g_stop || since(t0) > timeout) && !stopped) {
      stopped = true, late = !g_stop;
      cg->kill_all();
    }
    std::this_thread::sleep_for(k_poll);
  }
  Outcome out;
  out.makespan = since(t0);
  out.oom_kills = cg->oom_kills();
  out.peak_share = cg->peak() / double(limit);
  if (g_stop) throw std::runtime_error("stopped by a signal");
  if (late) throw std::runtime_error(fmt::format("a run took over {} s; its output is in {}", timeout, log.string()));
  const std::string text = slurp(log);
  if (text.find("Total graphs:") == std::string::npos)
    throw std::runtime_error(fmt::format("neffcache compile ended ({:#x}) without its report:\n{}", status,
                                         text.substr(text.size() > 2000 ? text.size() - 2000 : 0)));
  return out;
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
  int reps = 3, graphs = 40, ours_jobs = 0, small_graphs = 80;
  uint64_t limit_mib = 1536, small_limit_mib = 4096, kib_per_instruction = 64;
  double rate = 3000, small_rate = 800, run_timeout = 900;
  std::string work_dir = "/var/tmp";
  CLI::App app{"bench_memory: compiles admitted by memory against fixed counts, in a memory cgroup (root)"};
  app.add_option("--reps", reps, "repetitions")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--graphs", graphs, "graphs in the batch")->capture_default_str()->check(CLI::Range(2, 10000));
  app.add_option("--limit-mib", limit_mib, "the cgroup's memory limit, MiB")->capture_default_str()->check(CLI::Range(64, 1 << 30));
  app.add_option("--kib-per-instruction", kib_per_instruction, "fake compiler's memory per instruction, KiB")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--rate", rate, "fake-neuronx-cc instructions per second")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--ours-jobs", ours_jobs, "-j of ours (0: the number of graphs)")->capture_default_str();
  app.add_option("--small-graphs", small_graphs, "graphs in the small batch (0: none)")
      ->capture_default_str()
      ->check(CLI::Range(0, 10000));
  app.add_option("--small-limit-mib", small_limit_mib, "the cgroup's memory limit in the small batch, MiB")
      ->capture_default_str()
      ->check(CLI::Range(64, 1 << 30));
  app.add_option("--small-rate", small_rate, "fake-neuronx-cc instructions per second in the small batch")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--run-timeout", run_timeout, "seconds before a run is stopped as a failure")->capture_default_str();
  app.add_option("--dir", work_dir, "where the caches are made")->capture_default_str();
  bool keep = false;
  app.add_flag("--keep", keep, "keep every run's cache, ledger and output (DIR/neffcache-memory-*/rep*-*), to look into");
  CLI11_PARSE(app, argc, argv);

  if (::geteuid() != 0) return skipped("needs root (it creates a memory cgroup)"), 0;
  for (const auto& stale : test::MemoryCgroup::remove_stale())
    fmt::print(stderr, "bench_memory: removed {}, left by a run that died\n", stale);
  bool v2 = false;
  {
    // A probe, so that a hierarchy that refuses (a container's, with processes in its
    // root) gives a row that says why rather than a failure.
    std::string why;
    auto probe = test::MemoryCgroup::create(64 << 20, why);
    if (!probe) return skipped(fmt::format("cannot make a memory cgroup ({})", why)), 0;
    v2 = probe->v2();
  }

  const int neuron_slots =
      static_cast<int>(std::ceil(k_real_largest_peak / (k_largest_share * k_neuron_slot) - 1e-9));  // limit / slot
  const int host_slots = static_cast<int>(std::ceil(k_host_bytes / k_neuron_slot - 1e-9));
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  if (ours_jobs <= 0) ours_jobs = graphs;

  for (const char* v : {"NEURON_CC_FLAGS", "NEURON_PARALLEL_COMPILE_MAX_RETRIES", "NEURON_PARALLEL_COMPILE_DUMP_RESULTS",
                        "NEFFCACHE_FAKE_MEMORY_MB", "NEFFCACHE_FAKE_SECONDS", "NEFFCACHE_FAKE_FAIL", "NEFFCACHE_FAKE_ONLY",
                        "NEFFCACHE_FAKE_SIGNAL", "NEFFCACHE_FAKE_SIGNAL_ONCE", "NEFFCACHE_FAKE_HANG",
                        "NEFFCACHE_FAKE_NEFF_BYTES", "NEFFCACHE_FAKE_LOG", "NEFFCACHE_FAKE_EXCLUSIVE_DIR"})
    ::unsetenv(v);
  ::setenv("NEFFCACHE_FAKE_IDLE", "1", 1);
  ::setenv("NEFFCACHE_FAKE_MEMORY_CHILD", "1", 1);
  ::setenv("NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION", std::to_string(kib_per_instruction).c_str(), 1);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, [](int) { g_stop = 1; });

  const std::string compiler =
      std::string(test::path::fake_compiler) + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}";

  // A batch and who compiles it: ours first, ours with peaks known right after it (the
  // two stay together in the alternating order), then the fixed counts.
  struct Batch {
    std::string label;  // what its rows start with
    uint64_t limit_mib;  // of the cgroup that stands for the host
    Workload workload;
    std::vector<Contender> contenders;
  };
  std::vector<Batch> batches;
  batches.push_back(
      {"memory", limit_mib,
       make_workload(graphs, limit_mib, k_smallest_share, k_largest_share, kib_per_instruction, rate),
       {{"ours", ours_jobs, true},
        {"ours, peaks known", ours_jobs, true, true},
        {fmt::format("Neuron rule (-j {})", neuron_slots), neuron_slots},
        {fmt::format("one per core (-j {})", cores), cores}}});
  if (small_graphs > 0)
    batches.push_back({"memory, small graphs", small_limit_mib,
                       make_workload(small_graphs, small_limit_mib, k_small_low_share, k_small_high_share,
                                     kib_per_instruction, small_rate),
                       {{"ours", small_graphs, true},
                        {fmt::format("Neuron rule of a 512 GiB host (-j {})", host_slots), host_slots}}});
  for (const auto& b : batches) {
    const Workload& w = b.workload;
    double total_seconds = 0;
    for (const auto& g : w.graphs) total_seconds += w.seconds(g);
    fmt::print(stderr, "bench_memory: {}: cgroup {}, {} graphs peaking {:.0f}-{:.0f} MiB of {} MiB, {:.2g}-{:.2g} s each, "
               "{:.0f} s in all\n",
               b.label, v2 ? "v2" : "v1", w.graphs.size(), w.peak_mib(w.graphs.front()), w.peak_mib(w.graphs.back()),
               b.limit_mib, w.seconds(w.graphs.front()), w.seconds(w.graphs.back()), total_seconds);
  }

  std::string work = (fs::path(work_dir) / "neffcache-memory-XXXXXX").string();
  if (!::mkdtemp(work.data())) return fmt::print(stderr, "bench_memory: cannot create {}\n", work), 1;
  // results[b][c]: batch b's outcomes of its contender c, one per repetition.
  std::vector<std::vector<std::vector<Outcome>>> results;
  for (const auto& b : batches) results.emplace_back(b.contenders.size());
  bool learned = true;  // the first run left a .neffcache/memory/ folder
  try {
    for (int r = 0; r < reps; ++r)
      for (std::size_t bi = 0; bi < batches.size(); ++bi) {
        const Batch& b = batches[bi];
        ::setenv("NEFFCACHE_FAKE_RATE", fmt::format("{}", b.workload.rate).c_str(), 1);
        std::vector<std::vector<std::size_t>> groups;
        for (std::size_t c = 0; c < b.contenders.size(); ++c)
          if (b.contenders[c].known && !groups.empty()) groups.back().push_back(c);
          else groups.push_back({c});
        if (r % 2) std::reverse(groups.begin(), groups.end());
        fs::path first_cache;  // ours' cache of this repetition
        for (const auto& group : groups)
          for (std::size_t c : group) {
            const Contender& run = b.contenders[c];
            if (run.known && !(learned = fs::exists(first_cache / ".neffcache/memory"))) continue;
            const fs::path dir = fs::path(work) / fmt::format("rep{}-{}-{}", r, bi, c);
            const fs::path cache = dir / "cache";
            fs::create_directories(dir);
            auto entries = make_cache(cache, b.workload);
            std::vector<std::string> args = {"--compiler", compiler, "-j", std::to_string(run.jobs)};
            if (!run.ours) args.insert(args.end(), {"--mem-budget", "off"});
            args.insert(args.end(), {"--mem-ledger", (dir / "ledger").string()});
            if (run.ours && !run.known) first_cache = cache;
            if (run.known)
              fs::create_directories(cache / ".neffcache"),
                  fs::copy(first_cache / ".neffcache/memory", cache / ".neffcache/memory", fs::copy_options::recursive);
            Outcome o = run_in_cgroup(b.limit_mib << 20, cache, args, dir / "output.log", run_timeout);
            check_cache(entries, b.workload, o);
            fmt::print(stderr, "bench_memory: rep {} {}, {}: {:.1f} s, {} OOM kills, {} of {} done ({} whole), peak {:.0f}% "
                       "of the limit\n",
                       r, b.label, run.name, o.makespan, o.oom_kills, o.done, entries.size(), o.whole, o.peak_share * 100);
            results[bi][c].push_back(o);
          }
        if (!keep)
          for (const auto& d : fs::directory_iterator(work)) fs::remove_all(d.path());
      }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_memory: {}\n", e.what());
    if (keep) fmt::print(stderr, "bench_memory: kept {}\n", work);
    else fs::remove_all(work);
    return 1;
  }
  if (keep) fmt::print(stderr, "bench_memory: kept {}\n", work);
  else fs::remove_all(work);

  auto makespan = [](const Outcome& o) { return o.makespan; };
  auto throughput = [](const Outcome& o) { return o.done_seconds / o.makespan; };
  print_header();
  std::vector<double> broken;
  for (std::size_t bi = 0; bi < batches.size(); ++bi) {
    const Batch& b = batches[bi];
    const auto& res = results[bi];
    const auto& cs = b.contenders;
    const int n = static_cast<int>(b.workload.graphs.size());
    auto of = [&](std::size_t c, auto f) {
      std::vector<double> v;
      for (const auto& o : res[c]) v.push_back(f(o));
      return v;
    };
    // Of two contenders' runs in the same repetitions.
    auto ratio = [&](std::size_t a, std::size_t c, auto f) {
      std::vector<double> v;
      for (std::size_t i = 0; i < std::min(res[a].size(), res[c].size()); ++i) v.push_back(f(res[a][i]) / f(res[c][i]));
      return v;
    };
    std::vector<std::size_t> fixed, known;
    for (std::size_t c = 0; c < cs.size(); ++c)
      if (!cs[c].ours) fixed.push_back(c);
      else if (cs[c].known) known.push_back(c);
    const std::string batch = fmt::format("{} graphs in a {} MiB cgroup", n, b.limit_mib);
    for (std::size_t f : fixed)
      row(fmt::format("{}: makespan of {}, ours / {}", b.label, batch, cs[f].name), ratio(0, f, makespan), "ratio",
          "<= 0.67", [](double median, double, double) { return median <= 0.67; });
    for (std::size_t k : known)
      for (std::size_t f : fixed)
        row(fmt::format("{}: the same, ours with peaks known / {}", b.label, cs[f].name), ratio(k, f, makespan), "ratio");
    for (std::size_t f : fixed)
      row(fmt::format("{}: throughput (compile seconds of the done entries per second), ours / {}", b.label, cs[f].name),
          ratio(0, f, throughput), "ratio");
    for (std::size_t c = 0; c < cs.size(); ++c) row(fmt::format("{}: makespan, {}", b.label, cs[c].name), of(c, makespan), "s");
    for (std::size_t c = 0; c < cs.size(); ++c)
      row(fmt::format("{}: kernel OOM kills, {}", b.label, cs[c].name),
          of(c, [](const Outcome& o) { return double(o.oom_kills); }), "count", cs[c].ours ? "0" : "",
          [](double, double, double most) { return most == 0; });
    for (std::size_t c = 0; c < cs.size(); ++c)
      row(fmt::format("{}: entries done of {}, {}", b.label, n, cs[c].name),
          of(c, [](const Outcome& o) { return double(o.done); }), "count", cs[c].ours ? fmt::format("= {}", n) : "",
          [&](double, double least, double) { return least == n; });
    for (std::size_t c = 0; c < cs.size(); ++c)
      if (!res[c].empty() && res[c].front().peak_share > 0)
        row(fmt::format("{}: the cgroup's peak / its limit, {}", b.label, cs[c].name),
            of(c, [](const Outcome& o) { return o.peak_share; }), "ratio");
    for (const auto& outcomes : res)
      for (const auto& o : outcomes) broken.push_back(o.done - o.whole);
  }
  row("memory: done entries whose NEFF is not whole, all runs", broken, "count", "0",
      [](double, double, double most) { return most == 0; });
  if (!learned)
    fmt::print("| memory: ours with peaks known: not measured, ours' first run left no learned peaks (.neffcache/memory/) "
               "| | | | | 0 | | |\n");
  return 0;
}
