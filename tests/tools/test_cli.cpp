// The neffcache tool as a user runs it: output, exit codes, one-line errors.
#include <regex>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/cache/key.hpp>

#include "support.hpp"

using namespace neffcache;
using test::run;

namespace {

const test::fs::path k_hlo = test::k_corpus / "rocm08_normal_9.hlo_proto.pb";

// The expected entry path, computed through the library.
std::string library_key(const std::vector<std::string>& flags, const std::string& version) {
  auto k = entry_key(test::slurp(k_hlo), flags, version);
  REQUIRE(k.has_value());
  return k->relative_path();
}

}  // namespace

TEST_CASE("neffcache key prints the entry path", "[cli]") {
  auto r = run({"env", "-u", "NEURON_CC_FLAGS", test::k_tool, "key", k_hlo.string(),
                "--compiler-version", "2.21.0", "--flag=--target=trn1", "--flag", "-O1"});
  REQUIRE(r.exit_code == 0);
  CHECK(r.output == library_key({"--target=trn1", "-O1"}, "2.21.0") + "\n");
  CHECK(r.output.rfind("neuronxcc-2.21.0/MODULE_", 0) == 0);

  SECTION("without --flag it takes the compiler flags of NEURON_CC_FLAGS") {
    auto e = run({"env", "NEURON_CC_FLAGS=--target=trn1 --cache_dir=/elsewhere --retry_failed_compilation",
                  test::k_tool, "key", k_hlo.string(), "--compiler-version", "2.21.0"});
    REQUIRE(e.exit_code == 0);
    CHECK(e.output == library_key({"--target=trn1"}, "2.21.0") + "\n");
    CHECK(e.output.find("+e30acd3a\n") != std::string::npos);
  }
  SECTION("--json") {
    auto j = run({"env", "-u", "NEURON_CC_FLAGS", test::k_tool, "key", k_hlo.string(),
                  "--compiler-version", "2.21.0", "--json"});
    REQUIRE(j.exit_code == 0);
    auto doc = nlohmann::json::parse(j.output);
    CHECK(doc["path"] == library_key({}, "2.21.0"));
    CHECK(doc["flags_hash"] == "d7517139");
  }
}

TEST_CASE("neffcache key asks the installed compiler for its version", "[cli]") {
  test::TempDir bin;
  test::spit(bin / "neuronx-cc", "#!/bin/sh\necho 'NeuronX Compiler version 2.21.33.0+f00dfeed'\n"
                                 "echo 'Python version 3.10.12'\n");
  test::fs::permissions(bin / "neuronx-cc", test::fs::perms::owner_all);
  auto r = run({"env", "-u", "NEURON_CC_FLAGS", "PATH=" + bin.path().string() + ":/usr/bin:/bin",
                test::k_tool, "key", k_hlo.string()});
  REQUIRE(r.exit_code == 0);
  CHECK(r.output == library_key({}, "2.21.33.0+f00dfeed") + "\n");

  auto none = run({"env", "PATH=" + (bin / "empty").string(), test::k_tool, "key", k_hlo.string()});
  test::check_one_line_error(none, "pass --compiler-version");
}

TEST_CASE("neffcache key --explain writes the exact hashed text", "[cli]") {
  test::TempDir dir;
  auto explain = dir / "canonical.txt";
  auto r = run({"env", "-u", "NEURON_CC_FLAGS", test::k_tool, "key", k_hlo.string(),
                "--compiler-version", "1", "--explain", explain.string()});
  REQUIRE(r.exit_code == 0);
  std::string text = test::slurp(explain);
  auto sha = detail::Digest::sha256();
  sha.update(text);
  // The key's graph hash is the first 20 hex digits of sha256(dump).
  CHECK(r.output.find("MODULE_" + sha.hex().substr(0, 20) + "+") != std::string::npos);
}

TEST_CASE("bad input: one line, exit 1, no file left behind", "[cli]") {
  test::TempDir dir;
  test::spit(dir / "junk.pb", "this is not a protobuf at all");
  auto explain = dir / "explain.txt";
  auto r = run({test::k_tool, "key", (dir / "junk.pb").string(), "--compiler-version", "1",
                "--explain", explain.string()});
  test::check_one_line_error(r, "not a readable HLO module");
  CHECK_FALSE(test::fs::exists(explain));

  test::check_one_line_error(run({test::k_tool, "hlo-stats", (dir / "absent.pb").string()}),
                       "No such file or directory");
  test::check_one_line_error(run({test::k_tool, "key", k_hlo.string(), "--compiler-version", "a/b"}),
                       "bad compiler version");
  test::check_one_line_error(
      run({"env", "NEURON_CC_FLAGS=--target='trn1", test::k_tool, "key", k_hlo.string(), "--compiler-version", "1"}),
      "NEURON_CC_FLAGS: unterminated single quote");
  test::check_one_line_error(run({test::k_tool, "flags-hash", "--", "-O1", "--cache_dir"}), "--cache_dir needs a value");
}

TEST_CASE("usage errors exit 2; --help exits 0", "[cli]") {
  CHECK(run({test::k_tool}).exit_code == 2);
  CHECK(run({test::k_tool, "no-such-command"}).exit_code == 2);
  CHECK(run({test::k_tool, "key"}).exit_code == 2);
  auto help = run({test::k_tool, "key", "--help"});
  CHECK(help.exit_code == 0);
  CHECK(help.output.find("--explain") != std::string::npos);
}

TEST_CASE("neffcache flags-hash", "[cli]") {
  CHECK(run({test::k_tool, "flags-hash", "--", "--target=trn1"}).output == "e30acd3a\n");
  CHECK(run({test::k_tool, "flags-hash", "--legacy", "--", "--model-type=transformer"}).output == "abb26765\n");
  CHECK(run({test::k_tool, "flags-hash", "--legacy"}).output == "d41d8cd9\n");
  CHECK(run({test::k_tool, "flags-hash", "--", "--target=trn1", "--cache_dir=/x", "--no_cache"}).output ==
        "e30acd3a\n");
}

TEST_CASE("neffcache hlo-stats", "[cli]") {
  auto r = run({test::k_tool, "hlo-stats", "--json", k_hlo.string()});
  REQUIRE(r.exit_code == 0);
  auto doc = nlohmann::json::parse(r.output);
  CHECK(doc["format"] == "HloProto");
  CHECK(doc["computations"] == 3);
  CHECK(doc["instructions"] == 311);
  CHECK(doc["opcodes"]["parameter"].get<int>() >= 1);
  auto text = run({test::k_tool, "hlo-stats", k_hlo.string()});
  REQUIRE(text.exit_code == 0);
  CHECK(text.output.find("instructions      311") != std::string::npos);
}

TEST_CASE("every program says its version with --version, and the compiler stand-ins keep neuronx-cc's first line",
          "[cli][version]") {
  // <project version>+git<commits>.g<commit>[.dirty], or the project's version alone outside git.
  const std::regex version(R"(\d+\.\d+\.\d+(\+git\d+\.g[0-9a-f]+(\.dirty)?)?)");
  auto first_line = [](const std::string& s) { return s.substr(0, s.find('\n')); };
  std::smatch found;
  for (const auto& [program, name] : std::vector<std::pair<std::string, std::string>>{
           {test::k_tool, "neffcache"},
           {test::path::npc, "neuron_parallel_compile (neffcache)"},
           {test::k_sim, "neuron-client-sim (neffcache)"},
           {test::k_daemon, "neffcachefs (neffcache)"}}) {
    auto r = run({program, "--version"});
    INFO(program << ": " << r.output);
    CHECK(r.exit_code == 0);
    const std::string line = first_line(r.output);
    REQUIRE(line.starts_with(name + " "));
    CHECK(std::regex_match(line.substr(name.size() + 1), version));
  }
  // The daemon names the libfuse it runs with.
  CHECK(run({test::k_daemon, "--version"}).output.find("\nlibfuse 3.") != std::string::npos);
  // neuron_parallel_compile's --version after the trial run's command is the command's own.
  test::TempDir work;
  auto trial = run({test::path::npc, "--command", "collect", "--parallel_compile_workdir", work.path().string(), "sh",
                    "-c", "exit 3", "--version"});
  CHECK(trial.exit_code != 0);  // the trial run's exit status
  CHECK(trial.output.find("neuron_parallel_compile (neffcache)") == std::string::npos);

  // fake-neuronx-cc and neffcache-cc answer --version as neuronx-cc does on their first line
  // (the cache wrapper parses it); neffcache-cc's --version is the real compiler's, unchanged
  // (test_shim.cpp), and its own is --neffcache-version.
  auto fake = run({test::k_fake, "--version"});
  CHECK(first_line(fake.output) == "NeuronX Compiler version 2.21.0");
  CHECK(fake.output.find("fake-neuronx-cc (neffcache ") != std::string::npos);
  const std::string shim = std::string(test::path::shim_dir) + "/neuronx-cc";
  auto own = run({"env", "NEFFCACHE_REAL_COMPILER=" + test::k_fake, shim, "--neffcache-version"});
  CHECK(own.exit_code == 0);
  REQUIRE(first_line(own.output).starts_with("neffcache-cc (neffcache) "));
  CHECK(std::regex_match(first_line(own.output).substr(25), version));
  CHECK(own.output.find("real compiler: " + test::k_fake + ", version 2.21.0\n") != std::string::npos);
}
