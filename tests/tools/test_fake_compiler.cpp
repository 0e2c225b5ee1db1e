// fake-neuronx-cc, the stand-in compiler every compile test relies on.
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/hlo/hlo.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "support.hpp"

using namespace neffcache;
using test::run;

namespace {
using test::k_fake;

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
  auto version = run({"env", "-u", "NEFFCACHE_FAKE_VERSION", k_fake, "--version"});
  CHECK(version.output.rfind("NeuronX Compiler version 2.21.0.0+fake\n", 0) == 0);
  auto chosen = run({"env", "NEFFCACHE_FAKE_VERSION=2.15.128.0+56dc5a86", k_fake, "--version"});
  CHECK(chosen.output.rfind("NeuronX Compiler version 2.15.128.0+56dc5a86\n", 0) == 0);
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
  // Dies once, then succeeds; by SIGKILL unless told another signal.
  auto marker = (dir / "once").string();
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_SIGNAL_ONCE=" + marker}).exit_code == -1);
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_SIGNAL_ONCE=" + marker}).exit_code == 0);
  auto term = (dir / "once-term").string();
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_SIGNAL_ONCE=" + term, "NEFFCACHE_FAKE_ONCE_SIGNAL=TERM"}).exit_code == -1);
  CHECK(compile(in, out, {"NEFFCACHE_FAKE_SIGNAL_ONCE=" + term, "NEFFCACHE_FAKE_ONCE_SIGNAL=TERM"}).exit_code == 0);
  // A failure prints what it is told to, as it is: neuronx-cc's own OOM report here.
  auto f137 = compile(in, out, {"NEFFCACHE_FAKE_FAIL=70", "NEFFCACHE_FAKE_FAIL_MESSAGE=[F137] neuronx-cc was forcibly killed"});
  CHECK(f137.exit_code == 70);
  CHECK(f137.output.find("\n[F137] neuronx-cc was forcibly killed\n") != std::string::npos);
  CHECK(f137.output.find("injected compile failure") == std::string::npos);
  // Every compile is logged, so tests can count them across processes.
  auto log = (dir / "compiles.log").string();
  compile(in, out, {"NEFFCACHE_FAKE_LOG=" + log});
  compile(in, out, {"NEFFCACHE_FAKE_LOG=" + log});
  std::string lines = test::slurp(log);
  CHECK(std::count(lines.begin(), lines.end(), '\n') == 2);
}

TEST_CASE("NEFFCACHE_FAKE_IDLE spends the compile time asleep, not on the CPU", "[fake]") {
  test::TempDir dir;
  auto cpu = [](const struct rusage& u) { return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6; };
  // The children's CPU and the wall time of one compile of the corpus file.
  auto run = [&](const std::vector<std::string>& env, double& wall) {
    struct rusage before {}, after {};
    ::getrusage(RUSAGE_CHILDREN, &before);
    auto t0 = std::chrono::steady_clock::now();
    auto r = compile(test::k_corpus / "gopjrt_tuple.hlo.pb", dir / "m.neff", env);
    wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ::getrusage(RUSAGE_CHILDREN, &after);
    REQUIRE(r.exit_code == 0);
    CHECK(fake::parse_fake_neff(test::slurp(dir / "m.neff")).has_value());
    return cpu(after) - cpu(before);
  };
  // What the compiler burns besides the compile time (start, parse, write) is measured, not
  // guessed: under a sanitizer it alone came near 0.3 s.
  double wall = 0;
  double plain = run({"NEFFCACHE_FAKE_SECONDS=0"}, wall);
  double idle = run({"NEFFCACHE_FAKE_SECONDS=0.6", "NEFFCACHE_FAKE_IDLE=1"}, wall);
  CHECK(wall >= 0.6);              // the time passed...
  CHECK(idle - plain < 0.3);       // ...without being burnt (it would be 0.6 s more)
}

namespace {
// A /proc/<pid>/status value in KiB ("VmHWM:", "VmRSS:"); -1 when absent.
long status_kib(pid_t pid, const std::string& key) {
  auto text = neffcache::detail::read_file(fmt::format("/proc/{}/status", pid));
  if (!text) return -1;
  auto at = text->find("\n" + key);
  if (at == std::string::npos) return -1;
  return std::strtol(text->c_str() + at + 1 + key.size(), nullptr, 10);
}
}  // namespace

TEST_CASE("NEFFCACHE_FAKE_MEMORY_CHILD holds the memory in a child; the top process stays small", "[fake]") {
  test::TempDir dir;
  auto in = test::k_corpus / "gopjrt_tuple.hlo.pb";
  std::vector<std::string> argv{"env",  "NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_MEMORY_MB=64", "NEFFCACHE_FAKE_MEMORY_CHILD=1",
                                "NEFFCACHE_FAKE_SECONDS=20", "NEFFCACHE_FAKE_IDLE=1", k_fake, "compile",
                                in.string(), "--output", (dir / "o.neff").string()};
  test::Child fake(argv);  // env becomes the fake: the same pid
  pid_t holder = 0;
  for (std::string line; holder == 0 && !(line = fake.line()).empty();)
    std::sscanf(line.c_str(), "touched 64 MiB in a child process (pid %d)", &holder);
  REQUIRE(holder > 0);
  // Touched before the compile's time is spent, and held meanwhile.
  CHECK(status_kib(holder, "VmRSS:") >= 60 * 1024);
  CHECK(status_kib(fake.pid(), "VmHWM:") < 32 * 1024);
  // The OOM killer takes the largest process: the fake reports it as neuronx-cc does.
  ::kill(holder, SIGKILL);
  auto rest = fake.rest();
  CHECK(rest.find("[F137] neuronx-cc was forcibly killed - This most commonly occurs due to insufficient system memory.") !=
        std::string::npos);
  CHECK(fake.wait() == 70);
  CHECK_FALSE(test::fs::exists(dir / "o.neff"));


  // Left alone, the child lets go once the time is spent, and the compile succeeds.
  auto r = compile(in, dir / "p.neff",
                   {"NEFFCACHE_FAKE_MEMORY_MB=8", "NEFFCACHE_FAKE_MEMORY_CHILD=1", "NEFFCACHE_FAKE_SECONDS=0.2",
                    "NEFFCACHE_FAKE_IDLE=1"});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find("touched 8 MiB in a child process") != std::string::npos);
  CHECK(fake::parse_fake_neff(test::slurp(dir / "p.neff")).has_value());
}

TEST_CASE("NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION touches memory in proportion to the graph", "[fake]") {
  test::TempDir dir;
  for (std::string name : {"gopjrt_tuple.hlo.pb", "rocm08_normal_9.hlo_proto.pb"}) {
    INFO(name);
    auto r = compile(test::k_corpus / name, dir / "o.neff",
                     {"NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION=1024", "NEFFCACHE_FAKE_MEMORY_MB=3"});
    REQUIRE(r.exit_code == 0);
    auto instructions = analyze_hlo(test::slurp(test::k_corpus / name))->stats.instructions;
    // 1 MiB per instruction, plus the fixed 3 MiB.
    CHECK(r.output.find(fmt::format("touched {} MiB\n", instructions + 3)) != std::string::npos);
  }
}
