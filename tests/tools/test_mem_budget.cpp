// Admission by memory as users meet it: `neffcache compile` in a real memory cgroup, its
// compiles reserving their predicted peaks in the host's ledger; and the options.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/compile/memory.hpp>

#include "cgroup.hpp"
#include "support.hpp"

using namespace neffcache;
namespace fs = std::filesystem;

namespace {

// Stores `n` corpus graphs (different graphs) as pending entries of `cache`.
void put_graphs(const fs::path& cache, int n) {
  auto files = test::corpus_files();
  for (int i = 0; i < n; ++i) {
    auto r = test::run_tool({"put", "--cache", cache.string(), "--compiler-version", "2.21.0", files[i].string()});
    REQUIRE(r.exit_code == 0);
  }
}

// A compiler that logs when each compile starts and ends, around the fake one.
std::string timed_compiler(const fs::path& dir, const fs::path& log) {
  const fs::path script = dir / "timed-cc";
  // (It answers --version as the compiler: only that compiler's folder is compiled.)
  std::ofstream(script) << "#!/bin/sh\n[ \"$1\" = --version ] && exec " << test::k_fake << " --version\necho \"+ $(date +%s%N)\" >> "
                        << log.string() << "\n\"$@\"\nrc=$?\necho \"- " << "$(date +%s%N)\" >> " << log.string()
                        << "\nexit $rc\n";
  fs::permissions(script, fs::perms::owner_all);
  return script.string() + " " + test::k_fake_template;
}

// The most compiles that ran at once, from a timed_compiler log.
int most_at_once(const fs::path& log) {
  std::vector<std::pair<long long, int>> events;
  std::ifstream in(log);
  std::string sign;
  for (long long t; in >> sign >> t;) events.emplace_back(t, sign == "+" ? 1 : -1);
  std::sort(events.begin(), events.end());
  int now = 0, most = 0;
  for (auto [t, d] : events) most = std::max(most, now += d);
  return most;
}

// `neffcache compile -j 8` of every entry of `cache` inside `cg`, each fake compile holding
// 450 MiB for 2 s; `extra`: more options.
test::ToolRun compile_in(const test::MemoryCgroup& cg, const fs::path& cache, const std::string& compiler,
                         const std::vector<std::string>& extra = {}) {
  std::vector<std::string> argv{"env", "-u", "NEURON_CC_FLAGS", "-u", "NEURON_COMPILE_CACHE_URL", "-u",
                                "NEURON_PARALLEL_COMPILE_MAX_RETRIES", "NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_MEMORY_MB=450",
                                "NEFFCACHE_FAKE_SECONDS=2", "NEFFCACHE_FAKE_IDLE=1", test::k_tool, "compile", "--cache",
                                cache.string(), "-j", "8", "--compiler", compiler, "--json"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  // (About 20 s alone; twice seen over a minute beside the other tests of a stage, 4 at once,
  // under ASan and in Release.)
  return test::run(cg.wrap(argv), std::chrono::seconds(240));
}

// A 1.5 GiB memory cgroup, or the test is skipped with the reason.
std::unique_ptr<test::MemoryCgroup> cgroup_or_skip() {
  std::string why;
  auto cg = test::MemoryCgroup::create(1536ull << 20, why);
  if (!cg) SKIP("memory cgroup: " << why);
  return cg;
}

std::size_t done_entries(const fs::path& cache) {
  auto r = test::run_tool({"ls", "--cache", cache.string(), "--state", "done", "--json"});
  REQUIRE(r.exit_code == 0);
  return nlohmann::json::parse(r.output).size();
}

}  // namespace

TEST_CASE("in a 1.5 GiB cgroup, 8 compiles of 450 MiB with -j 8: none killed; with peaks known, 2 or 3 at once",
          "[memory][cgroup]") {
  auto cg = cgroup_or_skip();
  test::TempDir t;
  const fs::path cache = t / "cache";
  put_graphs(cache, 8);

  // Peaks never seen: the first compile runs alone, the rest are predicted from it.
  auto first = compile_in(*cg, cache, timed_compiler(t.path(), t / "first.log"));
  INFO(first.output);
  CHECK(first.exit_code == 0);
  CHECK(cg->oom_kills() == 0);
  CHECK(done_entries(cache) == 8);
  CHECK(most_at_once(t / "first.log") <= 3);

  // The same graphs again (their NEFFs cleared; the peak history stays).
  REQUIRE(test::run_tool({"clear-neffs", "--cache", cache.string()}).exit_code == 0);
  REQUIRE(done_entries(cache) == 0);
  auto t0 = std::chrono::steady_clock::now();
  auto second = compile_in(*cg, cache, timed_compiler(t.path(), t / "second.log"));
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  INFO(second.output);
  CHECK(second.exit_code == 0);
  CHECK(cg->oom_kills() == 0);
  CHECK(done_entries(cache) == 8);
  const int at_once = most_at_once(t / "second.log");
  CHECK(at_once >= 2);
  CHECK(at_once <= 3);
  WARN(fmt::format("second batch: {:.1f} s, at most {} compiles at once", seconds, at_once));

  // ls shows each compile's peak and what it was admitted with.
  auto ls = test::run_tool({"ls", "--cache", cache.string(), "--json"});
  for (const auto& e : nlohmann::json::parse(ls.output)) {
    CHECK(e.value("peak_kib", 0) >= 450 * 1024);
    CHECK(e.value("predicted_peak_kib", 0) >= e.value("peak_kib", 0));
  }
}

TEST_CASE("the same batch with admission off (-j 8 fixed slots) is killed for lack of memory", "[memory][cgroup]") {
  auto cg = cgroup_or_skip();
  test::TempDir t;
  const fs::path cache = t / "cache";
  put_graphs(cache, 8);
  compile_in(*cg, cache, test::k_fake_template, {"--mem-budget", "off"});
  // What the budget prevents: kills, each a transient failure (nothing recorded) after
  // its retries.
  CHECK(cg->oom_kills() > 0);
  auto stats = test::run_tool({"stats", "--cache", cache.string(), "--json"});
  CHECK(nlohmann::json::parse(stats.output)["states"]["failed"] == 0);
}

TEST_CASE("a bad memory budget is one line and exit 1; the ledger shows a running compile", "[memory]") {
  test::TempDir t;
  const fs::path cache = t / "cache";
  put_graphs(cache, 1);
  auto bad = test::run_tool({"compile", "--cache", cache.string(), "--mem-budget", "lots"});
  CHECK(bad.exit_code == 1);
  CHECK(bad.output.find("--mem-budget 'lots'") != std::string::npos);
  CHECK(std::count(bad.output.begin(), bad.output.end(), '\n') == 1);

  // While a compile runs, its reservation is in the ledger folder given, with its entry.
  const fs::path ledger = t / "ledger";
  test::Child proc({"env", "NEFFCACHE_FAKE_SECONDS=3", "NEFFCACHE_FAKE_IDLE=1", test::k_tool, "compile",
                                    "--cache", cache.string(), "--mem-budget", "10GiB", "--mem-ledger",
                                    ledger.string(), "--compiler", test::k_fake_template},
                   /*quiet_stderr=*/true);
  std::string record;
  for (int i = 0; i < 100 && record.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (fs::exists(ledger))
      for (const auto& e : fs::directory_iterator(ledger))
        if (e.path().filename().string()[0] != '.') record = test::slurp(e.path());
  }
  REQUIRE_FALSE(record.empty());
  auto j = nlohmann::json::parse(record);
  CHECK(j["program"] == "neffcache");
  CHECK(j["budget"] == 10ull << 30);
  // Never seen: the default (64 GiB), larger than the budget, so it runs alone.
  CHECK(j["reserved"] == 64ull << 30);
  CHECK(j["compiles"][0]["for"].get<std::string>().find("MODULE_") != std::string::npos);
  CHECK(proc.wait() == 0);
  std::size_t left = 0;
  for (const auto& e : fs::directory_iterator(ledger)) left += e.path().filename().string()[0] != '.';
  CHECK(left == 0);
}
