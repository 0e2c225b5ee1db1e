// neuron-client-sim, the stand-in for an unmodified torch-xla client, on a plain cache
// directory: its extraction mode feeds neuron_parallel_compile, after which training
// compiles nothing; clients racing on a cold cache compile each graph once.
#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include "support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string k_sim = NEFFCACHE_CLIENT_SIM;
const std::string k_fake = NEFFCACHE_FAKE_COMPILER;
const std::string k_template = k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}";
const std::vector<std::string> k_graphs{"spu_tf_jit_comp.hlo.pb", "rocm08_normal_9.hlo_proto.pb", "gopjrt_tuple.hlo.pb"};

// The environment of a client of `cache`: a clean Neuron environment, the fake compiler
// logging each compile to `log`, plus `env`.
std::vector<std::string> client_env(const fs::path& cache, const fs::path& log, std::vector<std::string> env = {}) {
  std::vector<std::string> argv{"env", "-u", "NEURON_CC_FLAGS", "-u", "NEURON_EXTRACT_GRAPHS_ONLY",
                                "NEURON_COMPILE_CACHE_URL=" + cache.string(), "NEFFCACHE_FAKE_RATE=0",
                                "NEFFCACHE_FAKE_LOG=" + log.string()};
  argv.insert(argv.end(), env.begin(), env.end());
  return argv;
}

std::vector<std::string> sim_command(std::vector<std::string> argv, std::vector<std::string> extra = {}) {
  for (const auto& a : {k_sim, std::string("--json"), std::string("--compiler"), k_template, std::string("--flag=-O1")})
    argv.push_back(a);
  argv.insert(argv.end(), extra.begin(), extra.end());
  for (const auto& g : k_graphs) argv.push_back((test::k_corpus / g).string());
  return argv;
}

nlohmann::json summary_of(const std::string& output) {
  auto begin = output.find("{\n");
  REQUIRE(begin != std::string::npos);
  return nlohmann::json::parse(output.substr(begin, output.rfind("\n}") + 2 - begin));
}

}  // namespace

TEST_CASE("neuron-client-sim: after neuron_parallel_compile, training compiles nothing itself", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache", log = dir / "compiles.log";
  // The simulator is the trial run: neuron_parallel_compile sets NEURON_EXTRACT_GRAPHS_ONLY.
  auto argv = client_env(cache, log);
  argv.insert(argv.begin() + 1, {"-C", dir.path().string()});
  argv.push_back(NEFFCACHE_NPC);
  argv.push_back("--compiler");
  argv.push_back(k_template);
  argv.push_back("--parallel_compile_workdir=" + (dir / "work").string());
  argv = sim_command(argv, {"--extract-interval", "0.05"});
  auto npc = test::run(argv);
  REQUIRE(npc.exit_code == 0);
  CHECK(npc.output.find("Total successful compilations: 3") != std::string::npos);
  CHECK(test::count_lines(log) == 3);
  // The trial run's output, kept; the cache it used, said.
  std::map<std::string, fs::path> kept;
  for (const auto& e : fs::directory_iterator(dir / "work")) kept[e.path().filename().string().substr(0, 10)] = e.path();
  CHECK(test::count_lines(kept["trial_run_"]) >= 3);
  CHECK(test::slurp(kept["cache_path"]) == cache.string() + "\n");

  auto train = test::run(sim_command(client_env(cache, log), {"--steps", "3"}));
  REQUIRE(train.exit_code == 0);
  auto s = summary_of(train.output);
  CHECK(s["mode"] == "train");
  CHECK(s["hits"] == 3);
  CHECK(s["compiled"] == 0);
  CHECK(s["steps"].size() == 3);
  for (const auto& g : s["per_graph"]) CHECK(g["neff_bytes"].get<int>() > 0);
  CHECK(test::count_lines(log) == 3);  // no compile beyond neuron_parallel_compile's
  CHECK(train.output.find("Using a cached neff at " + cache.string()) != std::string::npos);
}

TEST_CASE("neuron-client-sim: two clients on a cold cache compile each graph once", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache", log = dir / "compiles.log";
  auto env = client_env(cache, log, {"NEFFCACHE_FAKE_SECONDS=0.3"});
  test::Child a(sim_command(env, {"--poll", "0.02"}));
  test::Child b(sim_command(env, {"--poll", "0.02"}));
  auto sa = summary_of(a.rest()), sb = summary_of(b.rest());
  CHECK(a.wait() == 0);
  CHECK(b.wait() == 0);
  CHECK(sa["compiled"].get<int>() + sb["compiled"].get<int>() == 3);
  CHECK(sa["compiled"].get<int>() + sa["waited"].get<int>() + sa["hits"].get<int>() == 3);
  CHECK(sb["compiled"].get<int>() + sb["waited"].get<int>() + sb["hits"].get<int>() == 3);
  CHECK(test::count_lines(log) == 3);
  // Every lock is gone and every entry is done.
  auto scan = test::run({test::k_tool, "scan", "--json", "--cache", cache.string()});
  CHECK(nlohmann::json::parse(scan.output)["done"] == 3);
}

TEST_CASE("neuron-client-sim: a cached failure is reported, not compiled again", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache", log = dir / "compiles.log";
  auto bad = test::run(sim_command(client_env(cache, log, {"NEFFCACHE_FAKE_FAIL=1"})));
  CHECK(bad.exit_code == 1);
  CHECK(summary_of(bad.output)["failed"] == 3);
  const int compiles = test::count_lines(log);
  auto again = test::run(sim_command(client_env(cache, log)));
  CHECK(again.exit_code == 1);
  CHECK(again.output.find("Got a cached failed neff at ") != std::string::npos);
  CHECK(test::count_lines(log) == compiles);

  auto missing = test::run({k_sim, (dir / "nope.pb").string()});
  CHECK(missing.exit_code == 1);
  CHECK(missing.output.rfind("neuron-client-sim: error: ", 0) == 0);
  CHECK(std::count(missing.output.begin(), missing.output.end(), '\n') == 1);
}
