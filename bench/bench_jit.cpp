// Just-in-time training start, with and without the compiler shim (issue 23, item 7): N
// simulated ranks load M graphs as torch-xla does without neuron_parallel_compile (each
// miss compiled by whichever rank takes the entry's lock, the others waiting), naming
// entries as the real client does (neuron-client-sim --key raw). Half of the graphs are
// twins of graphs an earlier job compiled (the same graphs with other debug information:
// new names to the client), half are new. Each repetition runs the start on a fresh cache
// seeded by the earlier job, once with neffcache-cc first in PATH and once without,
// alternating which goes first, and compares the real compiles and the wall time of the
// two. The fake compiler sleeps --compile-seconds per compile (NEFFCACHE_FAKE_IDLE).
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "hlo_variants.hpp"
#include "jit_env.hpp"
#include "paths.hpp"
#include "process.hpp"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream out(p, std::ios::binary);
  out << bytes;
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

int lines(const fs::path& p) {
  std::ifstream in(p);
  int n = 0;
  for (std::string line; std::getline(in, line);) n += !line.empty();
  return n;
}

struct Options {
  int ranks = 4;
  int graphs = 8;
  int reps = 3;
  double compile_seconds = 1;
  std::string dir = "/var/tmp";
};

// `ranks` simulated ranks at once over `graphs` on `cache`, with `path` as PATH; the
// wall time until the last one is done. Throws when a rank fails.
double start_training(const Options& o, const fs::path& cache, const fs::path& log, const std::string& path,
                      const std::vector<fs::path>& graphs) {
  std::vector<std::string> argv = test::jit_env_words(
      cache, log, path, {"NEFFCACHE_FAKE_IDLE=1", fmt::format("NEFFCACHE_FAKE_SECONDS={}", o.compile_seconds)});
  argv.insert(argv.end(), {test::path::client_sim, "--key", "raw", "--flag=-O1", "--poll", "0.05"});
  for (const auto& g : graphs) argv.push_back(g.string());
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<test::Child>> ranks;
  for (int r = 0; r < o.ranks; ++r) ranks.push_back(std::make_unique<test::Child>(argv, /*quiet_stderr=*/true));
  for (auto& r : ranks) {
    (void)r->rest();
    if (int rc = r->wait(); rc != 0) throw std::runtime_error(fmt::format("a rank failed (exit {})", rc));
  }
  return since(t0);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"bench_jit: just-in-time training start, with and without neffcache-cc"};
  app.add_option("--ranks", o.ranks, "ranks of the job")->capture_default_str();
  app.add_option("--graphs", o.graphs, "graphs each rank loads (half twins of earlier ones, half new; at most 24)")
      ->capture_default_str();
  app.add_option("--reps", o.reps, "repetitions")->capture_default_str();
  app.add_option("--compile-seconds", o.compile_seconds, "what one compile takes")->capture_default_str();
  app.add_option("--dir", o.dir, "where the caches are made")->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::vector<fs::path> corpus;
  for (const auto& e : fs::directory_iterator(test::path::corpus))
    if (e.path().extension() == ".pb") corpus.push_back(e.path());
  std::sort(corpus.begin(), corpus.end());
  const int half = o.graphs / 2;
  if (half < 1 || o.graphs > static_cast<int>(corpus.size()) - 1) {
    fmt::print(stderr, "bench_jit: --graphs must be 2 to {}\n", corpus.size() - 1);
    return 2;
  }
  fs::path work = fs::path(o.dir) / fmt::format("neffcache-bench-jit-{}", ::getpid());
  fs::create_directories(work / "graphs");
  fs::create_directories(work / "sdk-bin");
  fs::create_symlink(test::path::fake_compiler, work / "sdk-bin" / "neuronx-cc");
  // The earlier job's graphs, their twins, and the new graphs.
  std::vector<fs::path> earlier, start;
  for (int i = 0; i < o.graphs; ++i) {
    if (i < half) {
      const std::string bytes = slurp(corpus[static_cast<std::size_t>(i)]);
      earlier.push_back(work / "graphs" / fmt::format("earlier-{}.pb", i));
      spit(earlier.back(), bytes);
      start.push_back(work / "graphs" / fmt::format("twin-{}.pb", i));
      spit(start.back(), test::debug_variant(bytes));
    } else {
      start.push_back(corpus[static_cast<std::size_t>(i)]);
    }
  }
  const std::string real = (work / "sdk-bin").string();
  const std::string with_shim = fmt::format("{}:{}:/usr/bin:/bin", test::path::shim_dir, real);
  const std::string without = fmt::format("{}:/usr/bin:/bin", real);

  std::vector<double> compiles_with, compiles_without, wall_with, wall_without, wall_ratio;
  try {
    for (int rep = 0; rep < o.reps; ++rep) {
      double wall[2], compiles[2];
      for (int k = 0; k < 2; ++k) {
        const bool shim = (k + rep) % 2 == 0;  // alternating which goes first
        const fs::path cache = work / fmt::format("cache-{}-{}", rep, shim ? "shim" : "plain");
        const fs::path log = work / fmt::format("log-{}-{}", rep, shim ? "shim" : "plain");
        // The earlier job compiled its graphs (with the shim, so that its index knows them
        // in the shim's run; the plain run has the same entries under their raw names).
        start_training(o, cache, work / "earlier.log", shim ? with_shim : without, earlier);
        wall[shim] = start_training(o, cache, log, shim ? with_shim : without, start);
        compiles[shim] = lines(log);
      }
      compiles_with.push_back(compiles[1]);
      compiles_without.push_back(compiles[0]);
      wall_with.push_back(wall[1]);
      wall_without.push_back(wall[0]);
      wall_ratio.push_back(wall[1] / wall[0]);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_jit: {}\n", e.what());
    fs::remove_all(work);
    return 1;
  }
  fs::remove_all(work);

  auto row = [&](std::string what, const std::vector<double>& v, const char* unit) {
    auto s = v;
    std::sort(s.begin(), s.end());
    fmt::print("| {} | {:.3g} | {:.3g} | {:.3g} | {} | {} |\n", what, median(s), s.front(), s.back(), unit, s.size());
  };
  fmt::print("| JIT training start, {} ranks x {} graphs ({} twins of an earlier job's), {} s per compile | median | min | max | unit | runs |\n",
             o.ranks, o.graphs, half, o.compile_seconds);
  fmt::print("|---|---:|---:|---:|---|---:|\n");
  row("real compiles, without the shim", compiles_without, "compiles");
  row("real compiles, with neffcache-cc first in PATH", compiles_with, "compiles");
  row("wall time, without the shim", wall_without, "s");
  row("wall time, with neffcache-cc", wall_with, "s");
  row("wall time, with / without", wall_ratio, "ratio");
  return 0;
}
