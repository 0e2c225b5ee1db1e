// Batch makespan: the 34-graph Llama-3-70B pre-compile, scaled down, compiled by
// `neffcache compile` (largest graph first) and in the original tool's order (path
// order, first come first served), each against the lower bound max(sum / P, longest)
// of its own measured compile times.
//
// The Neuron notes give the workload's range, not its 34 figures: 9.8 s to 225 s per
// graph. The graphs here spread geometrically over that range; each is a synthesized
// module whose instruction count makes fake-neuronx-cc (at --rate instructions per
// second) take --scale of the real time. The fake compiler sleeps that time away
// (NEFFCACHE_FAKE_IDLE), as a compiler on cores of its own would, so --jobs may exceed
// this machine's cores: the notes' trn1 node runs 8 compiles at once.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/neffcache.hpp>

#include "paths.hpp"
#include "synth.hpp"

namespace {

namespace fs = std::filesystem;
using namespace neffcache;
using Clock = std::chrono::steady_clock;

constexpr int k_graphs = bench::k_workload_graphs;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The lower bound of any schedule on `jobs` workers.
double lower_bound(const std::vector<double>& times, int jobs) {
  double sum = 0, longest = 0;
  for (double t : times) sum += t, longest = std::max(longest, t);
  return std::max(sum / jobs, longest);
}

// A fresh cache holding the workload; returns its entry folders.
std::vector<std::string> make_cache(const fs::path& root, double scale, double rate) {
  std::vector<std::string> entries;
  for (const std::string& hlo : bench::llama_workload(scale, rate)) {
    auto key = entry_key(hlo, {}, "2.21.0").value();
    auto entry = make_entry_folder(root.string(), key).value();
    (void)store_graph(entry, hlo, {}).value();
    entries.push_back(entry);
  }
  std::sort(entries.begin(), entries.end());  // path order
  return entries;
}

std::string fake_template() {
  return std::string(test::path::fake_compiler) + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}";
}

struct Run {
  double makespan = 0;
  std::vector<double> times;
};

// Ours: `neffcache compile` on the whole cache. This benchmark measures order alone: its
// fake compiles take no memory, so admission by memory is off (bench_memory measures it).
Run ours(const fs::path& root, int jobs) {
  Run run;
  auto t0 = Clock::now();
  auto r = detail::run_capture({test::path::tool, "compile", "--cache", root.string(), "-j", std::to_string(jobs),
                                "--mem-budget", "off", "--compiler", fake_template(), "--json"},
                               std::chrono::hours(1));
  run.makespan = since(t0);
  if (!r || r->exit_code != 0) throw std::runtime_error("neffcache compile failed");
  auto json = r->output.substr(r->output.find("\n{") + 1);
  const auto report = nlohmann::json::parse(json);
  for (const auto& [hlo, g] : report["compilation_report"].items()) run.times.push_back(g["compile_time"].get<double>());
  if (run.times.size() != k_graphs) throw std::runtime_error(fmt::format("{} graphs compiled", run.times.size()));
  return run;
}

// The original tool's order: `jobs` workers take the entries in path order.
Run path_order(const std::vector<std::string>& entries, int jobs) {
  CompileSettings settings;
  settings.compiler = CompilerTemplate::parse(fake_template()).value();
  Run run;
  std::mutex mu;
  std::size_t next = 0;
  std::string failure;
  auto t0 = Clock::now();
  std::vector<std::thread> workers;
  for (int w = 0; w < jobs; ++w)
    workers.emplace_back([&] {
      for (;;) {
        std::string entry;
        {
          std::lock_guard lk(mu);
          if (next == entries.size() || !failure.empty()) return;
          entry = entries[next++];
        }
        auto r = compile_entry(entry, settings);
        std::lock_guard lk(mu);
        if (r.outcome != CompileOutcome::success) failure = fmt::format("{}: {}", entry, r.message);
        run.times.push_back(r.compile_seconds);
      }
    });
  for (auto& w : workers) w.join();
  run.makespan = since(t0);
  if (!failure.empty()) throw std::runtime_error(failure);
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 3, jobs = 8;
  double scale = 0.02, rate = 5000;
  CLI::App app{"bench_makespan: the 34-graph Llama-3-70B pre-compile, scaled down: our order against path order"};
  app.add_option("--reps", reps, "repetitions")->capture_default_str();
  app.add_option("--jobs", jobs, "compiles at once")->capture_default_str();
  app.add_option("--scale", scale, "fraction of the real compile times")->capture_default_str();
  app.add_option("--rate", rate, "fake-neuronx-cc instructions per second")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  ::setenv("NEFFCACHE_FAKE_RATE", fmt::format("{}", rate).c_str(), 1);
  ::setenv("NEFFCACHE_FAKE_IDLE", "1", 1);

  std::string work = "/var/tmp/neffcache-makespan-XXXXXX";
  if (!::mkdtemp(work.data())) return fmt::print(stderr, "bench_makespan: cannot create {}\n", work), 1;
  std::vector<double> r_ours, r_path, r_vs;
  try {
    for (int r = 0; r < reps; ++r) {
      (void)make_cache(fs::path(work) / fmt::format("ours{}", r), scale, rate);
      auto a = ours(fs::path(work) / fmt::format("ours{}", r), jobs);
      auto b = path_order(make_cache(fs::path(work) / fmt::format("path{}", r), scale, rate), jobs);
      r_ours.push_back(a.makespan / lower_bound(a.times, jobs));
      r_path.push_back(b.makespan / lower_bound(b.times, jobs));
      r_vs.push_back(a.makespan / b.makespan);
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "bench_makespan: {}\n", e.what());
    fs::remove_all(work);
    return 1;
  }
  fs::remove_all(work);
  auto row = [](const std::string& what, std::vector<double> v, const std::string& goal, std::string met) {
    std::sort(v.begin(), v.end());
    fmt::print("| {} | {:.3g} | {:.3g} | {:.3g} | ratio | {} | {} | {} |\n", what, median(v), v.front(), v.back(), v.size(),
               goal, met);
  };
  fmt::print("| benchmark | median | min | max | unit | runs | goal | met |\n|---|---:|---:|---:|---|---:|---|---|\n");
  row(fmt::format("makespan of 34 graphs on {} workers / lower bound, neffcache compile", jobs), r_ours, "<= 1.05",
      median(r_ours) <= 1.05 ? "yes" : "**no**");
  row("the same, path order first come first served (the original tool)", r_path, "", "");
  row("makespan, neffcache compile / path order", r_vs, "", "");
  return 0;
}
