// Memory admission (issue 20 item 6): a batch of graphs whose compiles peak at very
// different sizes, compiled by `neffcache compile` inside a real memory cgroup that
// stands for a host, by ours (admission by predicted peak against a memory budget)
// and by two fixed counts of compiles at once, side by side in each repetition.
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
Outcome run_in_cgroup(uint64_t limit, const fs::path& cache, const std::vector<std::string>& args, const fs::path& log,
                      double timeout) {
  std::string why;
  auto cg = test::MemoryCgroup::create(limit, why);
  if (!cg) throw std::runtime_error(fmt::format("cannot make a memory cgroup: {}", why));
  std::vector<std::string> argv = {NEFFCACHE_TOOL, "compile", "--cache", cache.string()};
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

std::string contender_name(Contender c, int neuron_slots, int cores) {
  switch (c) {
    case Contender::ours: return "ours";
    case Contender::ours_known: return "ours, peaks known";
    case Contender::neuron_rule: return fmt::format("Neuron rule (-j {})", neuron_slots);
    case Contender::per_core: return fmt::format("one per core (-j {})", cores);
  }
  return "";
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
  int reps = 3, graphs = 40, ours_jobs = 0;
  uint64_t limit_mib = 1536, kib_per_instruction = 64;
  double rate = 3000, run_timeout = 900;
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

  const uint64_t limit = limit_mib << 20;
  const int neuron_slots =
      static_cast<int>(std::ceil(k_real_largest_peak / (k_largest_share * k_neuron_slot) - 1e-9));  // limit / slot
  const int cores = static_cast<int>(std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN)));
  if (ours_jobs <= 0) ours_jobs = graphs;

  for (const char* v : {"NEURON_CC_FLAGS", "NEURON_PARALLEL_COMPILE_MAX_RETRIES", "NEURON_PARALLEL_COMPILE_DUMP_RESULTS",
                        "NEFFCACHE_FAKE_MEMORY_MB", "NEFFCACHE_FAKE_SECONDS", "NEFFCACHE_FAKE_FAIL", "NEFFCACHE_FAKE_ONLY",
                        "NEFFCACHE_FAKE_SIGNAL", "NEFFCACHE_FAKE_SIGNAL_ONCE", "NEFFCACHE_FAKE_HANG",
                        "NEFFCACHE_FAKE_NEFF_BYTES", "NEFFCACHE_FAKE_LOG", "NEFFCACHE_FAKE_EXCLUSIVE_DIR"})
    ::unsetenv(v);
  ::setenv("NEFFCACHE_FAKE_RATE", fmt::format("{}", rate).c_str(), 1);
  ::setenv("NEFFCACHE_FAKE_IDLE", "1", 1);
  ::setenv("NEFFCACHE_FAKE_MEMORY_CHILD", "1", 1);
  ::setenv("NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION", std::to_string(kib_per_instruction).c_str(), 1);
  for (int s : {SIGINT, SIGTERM, SIGHUP}) std::signal(s, [](int) { g_stop = 1; });

  const std::string compiler =
      std::string(NEFFCACHE_FAKE_COMPILER) + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}";

  const Workload workload = make_workload(graphs, limit_mib, kib_per_instruction, rate);
  double total_seconds = 0;
  for (const auto& g : workload.graphs) total_seconds += workload.seconds(g);
  fmt::print(stderr, "bench_memory: cgroup {}, {} graphs peaking {:.0f}-{:.0f} MiB of {} MiB, {:.2g}-{:.2g} s each, "
             "{:.0f} s in all\n",
             v2 ? "v2" : "v1", graphs,
             workload.peak_mib(workload.graphs.front()), workload.peak_mib(workload.graphs.back()), limit_mib,
             workload.seconds(workload.graphs.front()), workload.seconds(workload.graphs.back()), total_seconds);

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
            args.insert(args.end(), {"-j", std::to_string(jobs), "--mem-budget", "off"});
          }
          args.insert(args.end(), {"--mem-ledger", (dir / "ledger").string()});
          if (run == Contender::ours) first_cache = cache;
          if (run == Contender::ours_known)
            fs::create_directories(cache / ".neffcache"),
                fs::copy(first_cache / ".neffcache/memory", cache / ".neffcache/memory", fs::copy_options::recursive);
          Outcome o = run_in_cgroup(limit, cache, args, dir / "output.log", run_timeout);
          check_cache(entries, workload, o);
          fmt::print(stderr, "bench_memory: rep {} {}: {:.1f} s, {} OOM kills, {} of {} done ({} whole), peak {:.0f}% of the limit\n",
                     r, contender_name(run, neuron_slots, cores), o.makespan, o.oom_kills, o.done, graphs, o.whole,
                     o.peak_share * 100);
          results[run].push_back(o);
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
  const std::string batch = fmt::format("{} graphs in a {} MiB cgroup", graphs, limit_mib);
  print_header();
  const std::vector<Contender> fixed = {Contender::neuron_rule, Contender::per_core};
  for (Contender f : fixed)
    row(fmt::format("memory: makespan of {}, ours / {}", batch, contender_name(f, neuron_slots, cores)),
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
    fmt::print("| memory: ours with peaks known: not measured, ours' first run left no learned peaks (.neffcache/memory/) "
               "| | | | | 0 | | |\n");
  return 0;
}
