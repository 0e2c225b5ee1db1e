// fake-neuronx-cc, the stand-in compiler every compile test relies on.
#include <sys/resource.h>

#include <chrono>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/hlo.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "support.hpp"

using namespace neffcache;
using test::run;

namespace {
const std::string k_fake = NEFFCACHE_FAKE_COMPILER;

test::ToolRun compile(const test::fs::path& in, const test::fs::path& out,
                      std::vector<std::string> env = {}, std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{"env", "NEFFCACHE_FAKE_RATE=0"};
  argv.insert(argv.end(), env.begin(), env.end());
  for (std::string a : {k_fake, std::string("compile"), std::string("--framework=XLA"),
                        std::string("--target=trn1"), in.string(), std::string("--output"), out.string()})
    argv.push_back(a);
  argv.insert(argv.end(), extra.begin(), extra.end());
  argv.push_back("--verbose=35");
  return run(argv);
}
}  // namespace

TEST_CASE("fake-neuronx-cc compiles every corpus file into an artifact naming its graph", "[fake]") {
  test::TempDir dir;
  for (const auto& f : test::corpus_files()) {
    INFO(f.filename());
    auto out = dir / (f.filename().string() + ".neff");
    auto r = compile(f, out, {}, {"-O1"});
    REQUIRE(r.exit_code == 0);
    CHECK(r.output.find("Compiler status PASS") != std::string::npos);
    auto neff = fake::parse_fake_neff(test::slurp(out));
    REQUIRE(neff.has_value());
    CHECK(neff->graph == analyze_hlo(test::slurp(f))->canonical_sha256);
    CHECK(neff->flags == R"(["--target=trn1", "-O1"])");
  }
}

TEST_CASE("fake NEFFs are checked whole: a cut or a flipped byte is detected", "[fake]") {
  test::TempDir dir;
  auto out = dir / "m.neff";
  REQUIRE(compile(test::k_corpus / "gopjrt_tuple.hlo.pb", out, {"NEFFCACHE_FAKE_NEFF_BYTES=100000"}).exit_code == 0);
  std::string bytes = test::slurp(out);
  CHECK(bytes.size() > 100000);
  CHECK(fake::parse_fake_neff(bytes).has_value());
  CHECK_FALSE(fake::parse_fake_neff(bytes.substr(0, bytes.size() - 1)).has_value());
  CHECK_FALSE(fake::parse_fake_neff(bytes.substr(0, bytes.size() / 2)).has_value());
  bytes[bytes.size() / 2] ^= 1;
  CHECK_FALSE(fake::parse_fake_neff(bytes).has_value());
}

TEST_CASE("fake-neuronx-cc refuses garbage and unknown options", "[fake]") {
  test::TempDir dir;
  test::spit(dir / "junk.pb", "not an HLO module");
  auto r = compile(dir / "junk.pb", dir / "o.neff");
  CHECK(r.exit_code == 1);
  CHECK(r.output.find("not a readable HLO module") != std::string::npos);
  CHECK_FALSE(test::fs::exists(dir / "o.neff"));

  auto bad = compile(test::k_corpus / "gopjrt_tuple.hlo.pb", dir / "o.neff", {}, {"--no-such-option"});
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("unrecognized arguments: --no-such-option") != std::string::npos);
  // The older argument order of the Neuron wrapper is accepted.
  auto old = run({"env", "NEFFCACHE_FAKE_RATE=0", k_fake, "--target=trn1", "compile",
                  (test::k_corpus / "gopjrt_tuple.hlo.pb").string(), "--output", (dir / "old.neff").string()});
  CHECK(old.exit_code == 0);
  auto version = run({k_fake, "--version"});
  CHECK(version.output.rfind("NeuronX Compiler version 2.21.0.0+fake\n", 0) == 0);
}

TEST_CASE("fake-neuronx-cc injects failures on request", "[fake]") {
  test::TempDir dir;
  auto in = test::k_corpus / "gopjrt_tuple.hlo.pb";
  auto out = dir / "o.neff";
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_FAIL=7"}).exit_code == 7);
  CHECK_FALSE(test::fs::exists(out));
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_SIGNAL=KILL"}).exit_code == -1);  // killed by a signal
  // Only the named modules fail.
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_FAIL=3", "NEFFCACHE_FAKE_ONLY=nothing,other"}).exit_code == 0);
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_FAIL=3", "NEFFCACHE_FAKE_ONLY=x,gopjrt_tu"}).exit_code == 3);
  // Dies once, then succeeds.
  auto marker = (dir / "once").string();
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_SIGNAL_ONCE=" + marker}).exit_code == -1);
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_SIGNAL_ONCE=" + marker}).exit_code == 0);
  // Every compile is logged, so tests can count them across processes.
  auto log = (dir / "compiles.log").string();
  compile(in, out, {"NEFFCACHE_FAKE_LOG=" + log});
  compile(in, out, {"NEFFCACHE_FAKE_LOG=" + log});
  std::string lines = test::slurp(log);
  CHECK(std::count(lines.begin(), lines.end(), '\n') == 2);
}

TEST_CASE("NEFFCACHE_FAKE_IDLE spends the compile time asleep, not on the CPU", "[fake]") {
  test::TempDir dir;
  struct rusage before {}, after {};
  ::getrusage(RUSAGE_CHILDREN, &before);
  auto t0 = std::chrono::steady_clock::now();
  auto r = compile(test::k_corpus / "gopjrt_tuple.hlo.pb", dir / "m.neff", {"NEFFCACHE_FAKE_SECONDS=0.6", "NEFFCACHE_FAKE_IDLE=1"});
  double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ::getrusage(RUSAGE_CHILDREN, &after);
  auto cpu = [](const struct rusage& u) { return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6; };
  REQUIRE(r.exit_code == 0);
  CHECK(fake::parse_fake_neff(test::slurp(dir / "m.neff")).has_value());
  CHECK(wall >= 0.6);                       // the time passed...
  CHECK(cpu(after) - cpu(before) < 0.3);    // ...without being burnt (it would be 0.6 s)
}
