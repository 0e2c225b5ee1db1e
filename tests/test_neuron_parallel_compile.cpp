// neuron_parallel_compile as a drop-in: a trial run in extraction mode, graphs compiled
// as they are extracted, the Neuron report and exit status, and the other --commands.
#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include "support.hpp"

namespace fs = std::filesystem;

namespace {

const std::string k_npc = NEFFCACHE_NPC;
const std::string k_fake = NEFFCACHE_FAKE_COMPILER;

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

test::ToolRun npc(const test::TempDir& dir, std::vector<std::string> args, std::vector<std::string> env = {}) {
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
  auto r = npc(dir, {"--num_parallel", "2", script.string()},
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
  CHECK(test::count_lines(dir / "neuron_parallel_compile.log") == 3);  // ...and kept
}

TEST_CASE("neuron_parallel_compile stops when the trial run fails, unless told to go on", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"gopjrt_tuple.hlo.pb"}, 3);
  auto r = npc(dir, {script.string()});
  CHECK(r.exit_code == 3);
  CHECK(r.output.find("NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE") != std::string::npos);
  r = npc(dir, {script.string()}, {"NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE=1"});
  CHECK(r.exit_code == 0);
  CHECK(report_of(r.output)["compilation_summary"]["true"] == 1);
}

TEST_CASE("neuron_parallel_compile --command collect, scan, compile, clean", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"gopjrt_tuple.hlo.pb", "rocm08_normal_9.hlo_proto.pb"});
  auto r = npc(dir, {"--command", "collect", script.string()});
  CHECK(r.exit_code == 0);
  CHECK(test::count_lines(dir / "compiles.log") == 0);
  r = npc(dir, {"--command", "scan"});
  CHECK(r.output.find("Current remaining items are 2, locked are 0, failed are 0, done are 0, total is 2") !=
        std::string::npos);
  r = npc(dir, {"--command", "compile"});
  CHECK(r.exit_code == 0);
  CHECK(report_of(r.output)["compilation_summary"]["true"] == 2);
  CHECK(test::count_lines(dir / "compiles.log") == 2);
  r = npc(dir, {"--command", "clear-neffs"});
  CHECK(r.exit_code == 0);
  r = npc(dir, {"--command", "scan-with-failed"});
  CHECK(r.output.find("remaining items are 2") != std::string::npos);
  r = npc(dir, {"--command", "clean"});
  CHECK(r.exit_code == 0);
  CHECK(fs::is_empty(dir / "cache"));
  CHECK(npc(dir, {"--command", "bogus"}).exit_code == 2);
  CHECK(npc(dir, {"--command", "collect"}).exit_code == 1);  // no command to run
}

TEST_CASE("neuron_parallel_compile --command analyze writes result.json for the extracted graphs", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"spu_tf_jit_comp.hlo.pb", "rocm08_normal_9.hlo_proto.pb"});
  auto r = npc(dir, {"--command", "analyze", script.string()});
  REQUIRE(r.exit_code == 0);
  CHECK(test::count_lines(dir / "compiles.log") == 0);  // analyzing compiles nothing
  auto j = nlohmann::json::parse(test::slurp(dir / "model_analysis_result" / "result.json"));
  CHECK(j["total"]["graphs"] == 2);
  CHECK(j["total"]["framework_ops"]["LessEqual"] == 2);
  r = npc(dir, {"--command", "analyze", "--analyze-output", "elsewhere", "--analyze-verbosity", "1", script.string()});
  REQUIRE(r.exit_code == 0);
  j = nlohmann::json::parse(test::slurp(dir / "elsewhere" / "result.json"));
  CHECK(j["verbosity"] == 1);
  CHECK_FALSE(j["total"].contains("framework_ops"));
  CHECK(npc(dir, {"--command", "analyze", "--analyze-verbosity", "3", script.string()}).exit_code == 2);
  auto nothing = dir / "nothing.sh";
  test::spit(nothing, "#!/bin/sh\necho no graphs\n");
  fs::permissions(nothing, fs::perms::owner_all);
  r = npc(dir, {"--command", "analyze", nothing.string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("extracted no graphs") != std::string::npos);
}

TEST_CASE("NEURON_PARALLEL_COMPILE_DUMP_RESULTS keeps the report as a JSON file", "[cli]") {
  test::TempDir dir;
  auto script = trial_script(dir, {"gopjrt_tuple.hlo.pb", "rocm08_normal_9.hlo_proto.pb"});
  auto r = npc(dir, {script.string()}, {"NEURON_PARALLEL_COMPILE_DUMP_RESULTS=1"});
  REQUIRE(r.exit_code == 0);
  auto kept = nlohmann::json::parse(test::slurp(dir / "neuron_parallel_compile_report.json"));
  CHECK(kept == report_of(r.output));
  CHECK(kept["compilation_summary"]["true"] == 2);
  // A path of one's own; the compile command keeps it too.
  REQUIRE(npc(dir, {"--command", "clear-neffs"}).exit_code == 0);
  r = npc(dir, {"--command", "compile"}, {"NEURON_PARALLEL_COMPILE_DUMP_RESULTS=" + (dir / "mine.json").string()});
  REQUIRE(r.exit_code == 0);
  CHECK(nlohmann::json::parse(test::slurp(dir / "mine.json"))["compilation_report"].size() == 2);
  // Off by default.
  fs::remove(dir / "neuron_parallel_compile_report.json");
  CHECK(npc(dir, {"--command", "compile"}).exit_code == 0);
  CHECK_FALSE(fs::exists(dir / "neuron_parallel_compile_report.json"));
}
