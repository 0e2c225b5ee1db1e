// neuron_parallel_compile as a drop-in: a trial run in extraction mode, graphs compiled
// as they are extracted, the Neuron report and exit status, and the other --commands.
#include <future>
#include <regex>
#include <set>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include "neuron_parallel_compile/schedule.hpp"
#include "support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string k_npc = test::path::npc;
using test::k_fake;
const std::string k_client_sim = test::path::client_sim;

// A stand-in training script: writes each graph into the cache with `neffcache put` and
// prints the line the Neuron framework prints; records the extraction variables it saw.
fs::path trial_script(const test::TempDir& dir, const std::vector<std::string>& corpus_files, int exit_code = 0) {
  std::string body = "#!/bin/sh\n";
  body += fmt::format("echo \"$NEURON_EXTRACT_GRAPHS_ONLY $NEURON_PARALLEL_COMPILE $NEURON_FALL_BACK_TO_NULL_NEFF\" > '{}'\n",
                      (dir / "seen-env").string());
  for (const auto& f : corpus_files)
    body += fmt::format(
        "p=$('{}' put --compiler-version 2.21.0 '{}') || exit 9\n"
        "echo \"INFO ||NEURON_CC_WRAPPER||: Extracting graphs ($p/model.hlo_module.pb) for ahead-of-time parallel "
        "compilation. No compilation was done.\"\nsleep 0.1\n",
        test::k_tool, (test::k_corpus / f).string());
  body += fmt::format("exit {}\n", exit_code);
  auto path = dir / "train.sh";
  test::spit(path, body);
  fs::permissions(path, fs::perms::owner_all);
  return path;
}

test::ToolRun run_npc(const test::TempDir& dir, std::vector<std::string> args, std::vector<std::string> env = {}) {
  // In `dir`, where the trial run's log is kept.
  std::vector<std::string> argv{"env", "-C", dir.path().string(), "-u", "NEURON_CC_FLAGS", "-u", "NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE",
                                "NEURON_COMPILE_CACHE_URL=" + (dir / "cache").string(), "NEFFCACHE_FAKE_RATE=0",
                                "NEFFCACHE_FAKE_LOG=" + (dir / "compiles.log").string()};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(k_npc);
  argv.push_back("--compiler");
  argv.push_back(k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}");
  argv.insert(argv.end(), args.begin(), args.end());
  return test::run(argv);
}

nlohmann::json report_of(const std::string& output) {
  auto begin = output.find("INFO ||NEURON_PARALLEL_COMPILE||: {");
  REQUIRE(begin != std::string::npos);
  begin = output.find('{', begin);
  auto end = output.find("\n}", begin);
  REQUIRE(end != std::string::npos);
  return nlohmann::json::parse(output.substr(begin, end + 2 - begin));
}

}  // namespace

TEST_CASE("neuron_parallel_compile collects and compiles; exit status = failed graphs", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"gopjrt_tuple.hlo.pb", "gopjrt_x_squared.hlo.pb", "rocm08_normal_9.hlo_proto.pb"});
  // gopjrt_x_squared's graph hash starts with b1752fb3 (see the key tests): make it fail.
  auto r = run_npc(dir, {"--num_parallel", "2", "--parallel_compile_workdir", (dir / "work").string(), script.string()},
               {"NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_ONLY=MODULE_b1752fb3"});
  CHECK(r.exit_code == 1);
  CHECK(test::slurp(dir / "seen-env") == "1 1 1\n");
  auto report = report_of(r.output);
  CHECK(report["compilation_summary"]["true"] == 2);
  CHECK(report["compilation_summary"]["false"] == 1);
  CHECK(report["compilation_report"].size() == 3);
  CHECK(r.output.find("INFO ||NEURON_PARALLEL_COMPILE||: Total graphs: 3") != std::string::npos);
  CHECK(r.output.find("Extracting graphs (") != std::string::npos);  // the trial run's output is shown
  CHECK(test::count_lines(dir / "compiles.log") == 3);
  // ...and kept in the work folder, named by the tool's pid.
  std::vector<fs::path> logs;
  for (const auto& e : fs::directory_iterator(dir / "work"))
    if (e.path().filename().string().starts_with("trial_run_pid")) logs.push_back(e.path());
  REQUIRE(logs.size() == 1);
  CHECK(test::count_lines(logs[0]) == 3);
}

TEST_CASE("neuron_parallel_compile stops when the trial run fails, unless told to go on", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"gopjrt_tuple.hlo.pb"}, 3);
  auto r = run_npc(dir, {script.string()});
  CHECK(r.exit_code == 3);
  CHECK(r.output.find("NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE") != std::string::npos);
  r = run_npc(dir, {script.string()}, {"NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE=1"});
  CHECK(r.exit_code == 0);
  CHECK(report_of(r.output)["compilation_summary"]["true"] == 1);
}

TEST_CASE("neuron_parallel_compile --command collect, scan, compile, clean", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"gopjrt_tuple.hlo.pb", "rocm08_normal_9.hlo_proto.pb"});
  auto r = run_npc(dir, {"--command", "collect", script.string()});
  CHECK(r.exit_code == 0);
  CHECK(test::count_lines(dir / "compiles.log") == 0);
  r = run_npc(dir, {"--command", "scan"});
  CHECK(r.output.find("Current remaining items are 2, locked are 0, failed are 0, done are 0, total is 2") !=
        std::string::npos);
  r = run_npc(dir, {"--command", "compile"});
  CHECK(r.exit_code == 0);
  CHECK(report_of(r.output)["compilation_summary"]["true"] == 2);
  CHECK(test::count_lines(dir / "compiles.log") == 2);
  r = run_npc(dir, {"--command", "clear-neffs"});
  CHECK(r.exit_code == 0);
  r = run_npc(dir, {"--command", "scan-with-failed"});
  CHECK(r.output.find("remaining items are 2") != std::string::npos);
  r = run_npc(dir, {"--command", "clean"});
  CHECK(r.exit_code == 0);
  CHECK(test::only_private_left(dir / "cache"));
  CHECK(run_npc(dir, {"--command", "bogus"}).exit_code == 2);
  CHECK(run_npc(dir, {"--command", "collect"}).exit_code == 1);  // no command to run
}

TEST_CASE("neuron_parallel_compile --command analyze writes result.json for the extracted graphs", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"spu_tf_jit_comp.hlo.pb", "rocm08_normal_9.hlo_proto.pb"});
  auto r = run_npc(dir, {"--command", "analyze", script.string()});
  REQUIRE(r.exit_code == 0);
  CHECK(test::count_lines(dir / "compiles.log") == 0);  // analyzing compiles nothing
  auto j = nlohmann::json::parse(test::slurp(dir / "model_analysis_result" / "result.json"));
  CHECK(j["total"]["graphs"] == 2);
  CHECK(j["total"]["framework_ops"]["LessEqual"] == 2);
  r = run_npc(dir, {"--command", "analyze", "--analyze-output", "elsewhere", "--analyze-verbosity", "1", script.string()});
  REQUIRE(r.exit_code == 0);
  j = nlohmann::json::parse(test::slurp(dir / "elsewhere" / "result.json"));
  CHECK(j["verbosity"] == 1);
  CHECK_FALSE(j["total"].contains("framework_ops"));
  CHECK(run_npc(dir, {"--command", "analyze", "--analyze-verbosity", "3", script.string()}).exit_code == 2);
  auto nothing = dir / "nothing.sh";
  test::spit(nothing, "#!/bin/sh\necho no graphs\n");
  fs::permissions(nothing, fs::perms::owner_all);
  r = run_npc(dir, {"--command", "analyze", nothing.string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("extracted no graphs") != std::string::npos);
}

TEST_CASE("NEURON_PARALLEL_COMPILE_DUMP_RESULTS keeps the report as a JSON file", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"gopjrt_tuple.hlo.pb", "rocm08_normal_9.hlo_proto.pb"});
  auto r = run_npc(dir, {script.string()}, {"NEURON_PARALLEL_COMPILE_DUMP_RESULTS=1"});
  REQUIRE(r.exit_code == 0);
  auto kept = nlohmann::json::parse(test::slurp(dir / "neuron_parallel_compile_report.json"));
  CHECK(kept == report_of(r.output));
  CHECK(kept["compilation_summary"]["true"] == 2);
  // The Neuron tool's two files, named by the Unix time, in the working directory.
  std::map<std::string, fs::path> neuron_files;
  static const std::regex name(R"((total_)?neuron_parallel_compile_results_(\d{10})\.json)");
  for (const auto& e : fs::directory_iterator(dir.path())) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (std::regex_match(file, m, name)) neuron_files[m[1].str()] = e.path();
  }
  REQUIRE(neuron_files.size() == 2);
  CHECK(nlohmann::json::parse(test::slurp(neuron_files[""])) == kept);
  auto total = nlohmann::json::parse(test::slurp(neuron_files["total_"]));
  CHECK(total["total_neuron_parallel_compile_time"].get<double>() >= kept["compilation_time"].get<double>());
  CHECK(neuron_files[""].filename().string().substr(32) == neuron_files["total_"].filename().string().substr(38));
  // A path of one's own; the compile command keeps it too.
  REQUIRE(run_npc(dir, {"--command", "clear-neffs"}).exit_code == 0);
  r = run_npc(dir, {"--command", "compile"}, {"NEURON_PARALLEL_COMPILE_DUMP_RESULTS=" + (dir / "mine.json").string()});
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(test::slurp(dir / "mine.json"))["compilation_report"].size() == 2);
  // Off by default.
  fs::remove(dir / "neuron_parallel_compile_report.json");
  CHECK(run_npc(dir, {"--command", "compile"}).exit_code == 0);
  CHECK_FALSE(fs::exists(dir / "neuron_parallel_compile_report.json"));
}

TEST_CASE("neuron_parallel_compile takes the Neuron tool's options anywhere and runs every other word", "[cli]") {
  test::TempDir dir;
  auto script = dir / "args.sh";
  test::spit(script, fmt::format("#!/bin/sh\necho \"$@\" > '{}'\n", (dir / "args").string()));
  fs::permissions(script, fs::perms::owner_all);
  // parse_known_args: ours wherever they stand, in both forms; the rest in order.
  auto r = run_npc(dir, {"--node_id", "0", "--world_size=1", script.string(), "--nproc_per_node=2", "train.py",
                     "--log_level", "WARNING", "--steps_this_run", "10", "--parallel_compile_workdir",
                     (dir / "work").string(), "--compiler", "gcc", "--", "--num_parallel", "3"});
  CHECK(r.exit_code == 0);
  // Our own additions (--compiler) only count before the command.
  CHECK(test::slurp(dir / "args") == "--nproc_per_node=2 train.py --steps_this_run 10 --compiler gcc --num_parallel 3\n");
  CHECK(fs::is_directory(dir / "work"));

  // The Neuron tool's rules for the multi-node options.
  test::check_one_line_error(run_npc(dir, {"--static_schedule", "--command", "compile"}), "--static_schedule needs --world_size",
                             "neuron_parallel_compile");
  test::check_one_line_error(run_npc(dir, {"--static_schedule", "--world_size", "2", script.string()}),
                             "does not work with --command collect-and-compile", "neuron_parallel_compile");
  test::check_one_line_error(run_npc(dir, {"--node_id", "2", "--world_size", "2", script.string()}),
                             "--node_id 2 is not below --world_size 2", "neuron_parallel_compile");
  CHECK(run_npc(dir, {"--world_size", "0", script.string()}).exit_code == 2);
  CHECK(run_npc(dir, {"--log_level", "LOUD", script.string()}).exit_code == 2);
}

TEST_CASE("neuron_parallel_compile --log_level filters the tool's own lines", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"gopjrt_tuple.hlo.pb", "gopjrt_x_squared.hlo.pb"});
  auto r = run_npc(dir, {"--log_level", "ERROR", script.string()}, {"NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_ONLY=MODULE_b1752fb3"});
  CHECK(r.exit_code == 1);  // the failed graph still counts
  CHECK(r.output.find("Extracting graphs (") != std::string::npos);  // the trial run's lines are not ours
  CHECK(r.output.find("||NEURON_PARALLEL_COMPILE||") == std::string::npos);
  CHECK(r.output.find("||NEURON_CACHE||") == std::string::npos);
  r = run_npc(dir, {"--log_level=DEBUG", "--command", "clear-neffs"});
  REQUIRE(r.exit_code == 0);
  r = run_npc(dir, {"--log_level=DEBUG", "--world_size", "2", script.string()}, {"NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_ONLY=MODULE_b1752fb3"});
  CHECK(r.output.find("DEBUG ||NEURON_PARALLEL_COMPILE||: neuronxcc-2.21.0/MODULE_") != std::string::npos);
  CHECK(r.output.find("INFO ||NEURON_PARALLEL_COMPILE||: Total graphs: 2") != std::string::npos);
}

TEST_CASE("neuron_parallel_compile on two nodes compiles every graph of a shared cache once", "[cli]") {
  test::TempDir dir;
  const std::vector<std::string> corpus{"gopjrt_tuple.hlo.pb",          "gopjrt_x_squared.hlo.pb",
                                        "rocm08_normal_9.hlo_proto.pb", "spu_tf_jit_comp.hlo.pb",
                                        "spu_jax_cnn.hlo.pb",           "spu_credit_fraud_predict.hlo.pb"};
  auto script = trial_script(dir, corpus);
  auto node = [&](int id) {
    std::vector<std::string> argv{"env", "-C", dir.path().string(), "-u", "NEURON_CC_FLAGS",
                                  "NEURON_COMPILE_CACHE_URL=" + (dir / "cache").string(), "NEFFCACHE_FAKE_SECONDS=0.5",
                                  "NEFFCACHE_FAKE_IDLE=1",
                                  fmt::format("NEFFCACHE_FAKE_LOG={}/compiles-{}.log", dir.path().string(), id), k_npc,
                                  "--compiler", k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}",
                                  "--node_id", std::to_string(id), "--world_size", "2", "--num_parallel", "1",
                                  // Two nodes are two hosts: each its own memory ledger.
                                  "--mem-ledger", fmt::format("{}/ledger-{}", dir.path().string(), id),
                                  "--parallel_compile_workdir", fmt::format("{}/work-{}", dir.path().string(), id),
                                  script.string()};
    return std::async(std::launch::async, [argv] { return neffcache::detail::run_capture(argv, std::chrono::seconds(120)); });
  };
  auto first = node(0), second = node(1);
  auto runs = {first.get(), second.get()};
  std::set<std::string> reported, compiled;
  int compiles = 0;
  int id = 0;
  for (const auto& r : runs) {
    REQUIRE(r.has_value());
    INFO(r->output);
    CHECK(r->exit_code == 0);  // both finish
    const auto report = report_of(r->output);
    for (const auto& [hlo, item] : report["compilation_report"].items()) {
      CHECK(item["status"] == true);
      reported.insert(hlo);
    }
    // Every compile of this node, by the entry it compiled (the key in the input's name). A
    // node that compiled nothing has no log: the other one took its share (stealing is how
    // the nodes balance, and a node started late under load may find everything taken).
    const auto log_file = dir / fmt::format("compiles-{}.log", id++);
    std::istringstream log(fs::exists(log_file) ? test::slurp(log_file) : std::string());
    int here = 0;
    for (std::string pid, uid, input; log >> pid >> uid >> input; ++here) {
      auto key = fs::path(input).filename().string();
      compiled.insert(key.substr(6, key.find('.', 6) - 6));
    }
    compiles += here;
  }
  // Exactly once: as many compiles as graphs, each of another entry; the reports cover every graph.
  std::set<std::string> entries;
  for (const auto& compiler_dir : fs::directory_iterator(dir / "cache"))
    for (const auto& e : fs::directory_iterator(compiler_dir)) {
      if (!compiler_dir.path().filename().string().starts_with("neuronxcc-")) break;  // our .neffcache
      entries.insert(e.path().filename().string());
      CHECK(fs::exists(e.path() / "model.done"));
      CHECK(reported.contains((e.path() / "model.hlo_module.pb").string()));
    }
  CHECK(entries.size() == corpus.size());
  CHECK(compiles == static_cast<int>(corpus.size()));
  CHECK(compiled == entries);
  CHECK(reported.size() == corpus.size());
}

TEST_CASE("neuron_parallel_compile --command compile shares the entries between nodes", "[cli]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  const auto corpus = test::corpus_files();
  std::vector<std::string> rels;
  for (std::size_t i = 0; i < 10; ++i) {
    auto r = test::run({test::k_tool, "put", "--cache", cache.string(), "--compiler-version", "2.21.0", corpus[i].string()});
    REQUIRE(r.exit_code == 0);
    rels.push_back(fs::relative(r.output.substr(0, r.output.size() - 1), cache).string());
  }
  std::sort(rels.begin(), rels.end());
  auto pending = [&] {
    std::set<std::string> out;
    for (const auto& rel : rels)
      if (!fs::exists(cache / rel / "model.done")) out.insert(rel);
    return out;
  };

  SECTION("static: a worker's slice of the sorted entries, and those of the 8 workers before it") {
    // 10 workers, one entry each: node 0's worker 0 takes entry 0 and steals from workers
    // 9..2 (the 8 before it, round the end); worker 1's entry is left to node 1.
    auto r = run_npc(dir, {"--command", "compile", "--static_schedule", "--world_size", "10", "--node_id", "0",
                       "--num_parallel", "1"});
    CHECK(r.exit_code == 0);
    CHECK(pending() == std::set<std::string>{rels[1]});
    CHECK(test::count_lines(dir / "compiles.log") == 9);
    r = run_npc(dir, {"--command", "compile", "--static_schedule", "--world_size", "10", "--node_id", "1",
                  "--num_parallel", "1"});
    CHECK(r.exit_code == 0);
    CHECK(pending().empty());
    CHECK(test::count_lines(dir / "compiles.log") == 10);
  }
  SECTION("dynamic: every node takes what is left after its own share") {
    auto r = run_npc(dir, {"--command", "compile", "--world_size", "3", "--node_id", "2"});
    CHECK(r.exit_code == 0);
    CHECK(pending().empty());
    CHECK(report_of(r.output)["compilation_report"].size() == 10);
  }
}

TEST_CASE("neuron_parallel_compile static slices: own first, then the 8 workers before", "[cli]") {
  using neffcache::Priority;
  // 2 nodes of 2 workers over 8 entries: worker g owns entries 2g, 2g+1.
  auto node1 = neffcache::npc::static_shares(8, {1, 2, 2});
  CHECK(node1[4] == Priority::background);
  CHECK(node1[7] == Priority::background);
  CHECK(node1[0] == Priority::deferred);
  CHECK(node1[3] == Priority::deferred);
  // 20 workers of one node each: node 10 steals from workers 2..9 and leaves the others.
  auto node10 = neffcache::npc::static_shares(20, {10, 20, 1});
  CHECK(node10[10] == Priority::background);
  CHECK(node10[2] == Priority::deferred);
  CHECK(node10[9] == Priority::deferred);
  CHECK_FALSE(node10[1].has_value());
  CHECK_FALSE(node10[11].has_value());
  // Dynamic: a stable owner for every entry, shared out between the nodes.
  CHECK(neffcache::npc::owner_node("neuronxcc-2.21.0/MODULE_a+b", 1) == 0);
  std::set<int> owners;
  for (int i = 0; i < 20; ++i) owners.insert(neffcache::npc::owner_node(fmt::format("neuronxcc-2.21.0/MODULE_{}+x", i), 3));
  CHECK(owners == std::set<int>{0, 1, 2});
}

TEST_CASE("neuron_parallel_compile compiles into the cache the trial run used", "[cli]") {
  test::TempDir dir;
  const auto theirs = dir / "theirs";
  // A training script that picks its cache in its own NEURON_CC_FLAGS, as the Neuron
  // documents show, and writes one more graph there without announcing it.
  auto script = dir / "train.sh";
  test::spit(script, fmt::format("#!/bin/sh\n"
                                 "export NEURON_CC_FLAGS=\"--cache_dir={0} --target=trn1\"\n"
                                 "'{1}' --compiler-version 2.21.0 --extract-interval 0 '{2}' '{3}' || exit 9\n"
                                 "'{4}' put --cache '{0}' --compiler-version 2.21.0 --flag=--target=trn1 '{5}' > /dev/null\n",
                                 theirs.string(), k_client_sim, (test::k_corpus / "gopjrt_tuple.hlo.pb").string(),
                                 (test::k_corpus / "rocm08_normal_9.hlo_proto.pb").string(), test::k_tool,
                                 (test::k_corpus / "spu_jax_cnn.hlo.pb").string()));
  fs::permissions(script, fs::perms::owner_all);
  auto r = run_npc(dir, {"--parallel_compile_workdir", (dir / "work").string(), script.string()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("INFO ||NEURON_CACHE||: Compile cache path: " + theirs.string() + "\n") != std::string::npos);
  CHECK(report_of(r.output)["compilation_report"].size() == 3);
  CHECK(test::count_lines(dir / "compiles.log") == 3);
  CHECK_FALSE(fs::exists(dir / "cache"));  // the tool's own cache is not touched
  std::size_t done = 0;
  for (const auto& c : fs::directory_iterator(theirs))
    for (const auto& e : fs::directory_iterator(c)) done += fs::exists(e.path() / "model.done");
  CHECK(done == 3);
  // The client wrote its cache into the file the tool named.
  std::vector<fs::path> logs;
  for (const auto& e : fs::directory_iterator(dir / "work"))
    if (e.path().filename().string().starts_with("cache_path_pid")) logs.push_back(e.path());
  REQUIRE(logs.size() == 1);
  CHECK(test::slurp(logs[0]) == theirs.string() + "\n");
}

TEST_CASE("neuron_parallel_compile: a line naming an entry folder is that graph; one naming no entry is a warning", "[cli]") {
  test::TempDir dir;
  auto script = dir / "train.sh";
  std::string body = "#!/bin/sh\n";
  body += fmt::format("p=$('{}' put --compiler-version 2.21.0 '{}') || exit 9\n", test::k_tool,
                      (test::k_corpus / "gopjrt_tuple.hlo.pb").string());
  body += "echo \"INFO ||NEURON_CC_WRAPPER||: Extracting graphs ($p) for ahead-of-time parallel compilation.\"\n";
  body += fmt::format("echo \"INFO ||NEURON_CC_WRAPPER||: Extracting graphs ({}/elsewhere/MODULE_1+2/model.hlo_module.pb) "
                      "for ahead-of-time parallel compilation.\"\n",
                      dir.path().string());
  test::spit(script, body);
  fs::permissions(script, fs::perms::owner_all);
  auto r = run_npc(dir, {script.string()});
  INFO(r.output);
  CHECK(r.exit_code == 0);
  auto report = report_of(r.output)["compilation_report"];
  REQUIRE(report.size() == 1);
  CHECK(report.begin().key().ends_with("+d7517139/model.hlo_module.pb"));
  CHECK(r.output.find(fmt::format("WARNING ||NEURON_PARALLEL_COMPILE||: {}/elsewhere/MODULE_1+2/model.hlo_module.pb is not "
                                  "a graph of the cache",
                                  dir.path().string())) != std::string::npos);
  CHECK(test::count_lines(dir / "compiles.log") == 1);
}
