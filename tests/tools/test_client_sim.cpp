// neuron-client-sim, the stand-in for an unmodified torch-xla client, on a plain cache
// directory: its extraction mode feeds neuron_parallel_compile, after which training
// compiles nothing; clients racing on a cold cache compile each graph once.
#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <neffcache/cache/layout.hpp>

#include "lnl.hpp"
#include "process.hpp"
#include "support.hpp"

namespace fs = std::filesystem;

namespace {

using test::k_sim;
using test::k_fake;
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
  argv.push_back(test::path::npc);
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

namespace {

// A vLLM Neuron client (--dialect lnl) whose cache is under `vllm_root`, plus `env`.
std::vector<std::string> lnl_sim(const fs::path& vllm_root, const fs::path& log, std::vector<std::string> env = {},
                                 std::vector<std::string> graphs = k_graphs, std::vector<std::string> options = {}) {
  std::vector<std::string> argv{"env", "-u", "NEURON_LIBTORCH_REMOTE_CACHE", "-u", "VLLM_NEURON_DISABLE_WARMUP_COMPILE",
                                "VLLM_CACHE_ROOT=" + vllm_root.string(), "NEFFCACHE_FAKE_RATE=0",
                                "NEFFCACHE_FAKE_LOG=" + log.string()};
  argv.insert(argv.end(), env.begin(), env.end());
  for (const auto& a : {k_sim, std::string("--dialect"), std::string("lnl"), std::string("--json"),
                        std::string("--compiler"), k_template, std::string("--flag=-O1"), std::string("--poll"),
                        std::string("0.05")})
    argv.push_back(a);
  argv.insert(argv.end(), options.begin(), options.end());
  for (const auto& g : graphs) argv.push_back((test::k_corpus / g).string());
  return argv;
}

}  // namespace

TEST_CASE("neuron-client-sim --dialect lnl: four ranks on a cold cache compile each graph once, marker last", "[cli][lnl]") {
  test::TempDir dir;
  const auto log = dir / "compiles.log";
  std::vector<std::unique_ptr<test::Child>> ranks;
  for (int r = 0; r < 4; ++r)
    ranks.push_back(std::make_unique<test::Child>(lnl_sim(dir.path(), log, {"NEFFCACHE_FAKE_SECONDS=0.3"}), true));
  int compiled = 0, loaded = 0;
  for (auto& r : ranks) {
    auto s = summary_of(r->rest());
    CHECK(r->wait() == 0);
    CHECK(s["failed"] == 0);
    compiled += s["compiled"].get<int>();
    loaded += s["hits"].get<int>() + s["waited"].get<int>();
  }
  CHECK(compiled == 3);
  CHECK(loaded == 9);
  CHECK(test::count_lines(log) == 3);
  const auto root = dir / "neuron" / "compile_cache";
  int entries = 0;
  for (const auto& e : fs::directory_iterator(root)) {
    if (!e.is_directory()) continue;
    ++entries;
    const std::string key = e.path().filename().string();
    CHECK(neffcache::is_lnl_key(key));
    for (const char* f : {"graph.hlo", "command.txt", ".artifact_metadata_v0.json", "log-neuron-cc.txt"})
      CHECK(fs::exists(e.path() / f));
    // The NEFF's size as the marker gives it.
    auto marker = test::slurp(e.path() / ".compilation_complete");
    CHECK(marker.find(fmt::format("\nneff_size:{}\n", fs::file_size(e.path() / ("graph_" + key + ".neff")))) !=
          std::string::npos);
    CHECK(fs::exists(test::lnl_lock(root, key)));  // left behind, as LNL leaves it
  }
  CHECK(entries == 3);
}

TEST_CASE("neuron-client-sim --dialect lnl: a remote cache's promoted entry is fetched, consumer mode refuses a miss", "[cli][lnl]") {
  test::TempDir dir;
  const auto log = dir / "compiles.log";
  // Node 1 compiles and promotes its entry to the remote (save_cache: a copy, then a rename).
  fs::create_directories(dir / "remote");
  auto first = test::run(lnl_sim(dir / "node1", log, {"NEURON_LIBTORCH_REMOTE_CACHE=" + (dir / "remote").string()},
                                 {k_graphs[0]}, {"--save-cache"}));
  REQUIRE(first.exit_code == 0);
  CHECK(summary_of(first.output)["promoted"] == 1);
  int promoted = 0;
  for (const auto& e : fs::directory_iterator(dir / "remote")) {
    CHECK(neffcache::is_lnl_key(e.path().filename().string()));  // no staging folder left
    CHECK(fs::exists(e.path() / ".compilation_complete"));
    ++promoted;
  }
  CHECK(promoted == 1);
  // Node 2 fetches the promoted graph and compiles only the one the remote lacks.
  auto second = test::run(lnl_sim(dir / "node2", log, {"NEURON_LIBTORCH_REMOTE_CACHE=" + (dir / "remote").string()},
                                  {k_graphs[0], k_graphs[1]}));
  REQUIRE(second.exit_code == 0);
  auto s = summary_of(second.output);
  CHECK(s["fetched"] == 1);
  CHECK(s["compiled"] == 1);
  CHECK(test::count_lines(log) == 2);
  // Node 3 must never compile: its miss fails at once, with the reason.
  auto third = test::run(lnl_sim(dir / "node3", log, {"VLLM_NEURON_DISABLE_WARMUP_COMPILE=1"}, {k_graphs[2]}));
  CHECK(third.exit_code == 1);
  CHECK(third.output.find("VLLM_NEURON_DISABLE_WARMUP_COMPILE=1 forbids compiling") != std::string::npos);
  CHECK(test::count_lines(log) == 2);
}

TEST_CASE("neuron-client-sim --dialect lnl --save-cache: two nodes that compiled one graph promote it once", "[cli][lnl]") {
  test::TempDir dir;
  const auto log = dir / "compiles.log";
  fs::create_directories(dir / "remote");
  // Both miss the remote, both compile; the first rename wins, the second finds the key taken.
  std::vector<std::unique_ptr<test::Child>> nodes;
  for (const char* node : {"node1", "node2"})
    nodes.push_back(std::make_unique<test::Child>(
        lnl_sim(dir / node, log,
                {"NEURON_LIBTORCH_REMOTE_CACHE=" + (dir / "remote").string(), "NEFFCACHE_FAKE_SECONDS=0.5"},
                {k_graphs[0]}, {"--save-cache"}),
        true));
  int promoted = 0, refused = 0;
  for (auto& n : nodes) {
    auto s = summary_of(n->rest());
    CHECK(n->wait() == 0);
    promoted += s["promoted"].get<int>();
    refused += s["promotion_refused"].get<int>();
  }
  CHECK(test::count_lines(log) == 2);
  CHECK(promoted == 1);
  CHECK(refused == 1);
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir / "remote")) names.push_back(e.path().filename().string());
  REQUIRE(names.size() == 1);  // the key, and no staging folder left behind
  CHECK(neffcache::is_lnl_key(names[0]));
}
