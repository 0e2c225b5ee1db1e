// neffcache-cc, the compiler shim, as just-in-time clients meet it: first in PATH as
// `neuronx-cc`, with the real compiler (the fake) further on. The clients are the
// simulator naming entries as the real client does (--key raw), so a graph that differs
// only in debug information is a new entry to them.
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include "../fuse/fuse_test.hpp"
#include "jit.hpp"
#include "support.hpp"

namespace fs = std::filesystem;

using test::jit_env;
using test::k_fake;
using test::k_shim_dir;
using test::path_with;
using test::real_compiler_dir;


TEST_CASE("neffcache-cc first in PATH: twins of compiled graphs never reach the real compiler, a new graph "
          "reaches it once for four ranks",
          "[shim]") {
  test::TempDir dir;
  const fs::path real = real_compiler_dir(dir);
  const auto [a, b, a2, b2, c] = test::jit_graphs(dir);

  SECTION("with the shim") {
    const fs::path cache = dir / "cache", log = dir / "compiles.log";
    const auto env = jit_env(cache, log, path_with({k_shim_dir, real}));
    auto first = test::train_jit(test::ranks_of(4, env), {a, b});
    CHECK(test::sum_of(first, "failed") == 0);
    CHECK(test::count_lines(log) == 2);  // one per graph across the four ranks
    // A later job whose graphs carry other debug information (new names to the client),
    // and one new graph.
    auto second = test::train_jit(test::ranks_of(4, env), {a2, b2, c});
    CHECK(test::sum_of(second, "failed") == 0);
    CHECK(test::sum_of(second, "hits") + test::sum_of(second, "waited") + test::sum_of(second, "compiled") == 12);
    CHECK(test::count_lines(log) == 3);  // only the new graph was compiled
    for (const auto& s : second)
      for (const auto& g : s["per_graph"]) CHECK(g["neff_bytes"].get<int>() > 0);  // each the right graph's NEFF
    auto stats = nlohmann::json::parse(test::slurp(cache / ".neffcache/shim-stats.json"));
    CHECK(stats["compiles"] == 3);
    CHECK(stats.value("hits", 0) + stats.value("waited", 0) >= 2);
  }
  SECTION("without it (the contrast)") {
    const fs::path cache = dir / "plain", log = dir / "plain.log";
    const auto env = jit_env(cache, log, path_with({real}));
    CHECK(test::sum_of(test::train_jit(test::ranks_of(4, env), {a, b}), "failed") == 0);
    CHECK(test::count_lines(log) == 2);
    CHECK(test::sum_of(test::train_jit(test::ranks_of(4, env), {a2, b2, c}), "failed") == 0);
    CHECK(test::count_lines(log) == 5);  // the twins compiled again
  }
}

TEST_CASE("neffcache-cc passes everything but a compile to the real compiler, and never runs itself", "[shim]") {
  test::TempDir dir;
  const fs::path real = real_compiler_dir(dir);
  const fs::path cache = dir / "cache", log = dir / "compiles.log";
  auto env = jit_env(cache, log, path_with({k_shim_dir, real}));
  auto direct = test::run({k_fake, "--version"});
  REQUIRE(direct.exit_code == 0);
  for (const char* v : {"--version", "-V"}) {
    auto argv = env;
    argv.insert(argv.end(), {"neuronx-cc", v});
    auto r = test::run(argv);
    CHECK(r.exit_code == 0);
    CHECK(r.output == direct.output);
  }
  // Whatever the real compiler makes of an odd command line, it makes of it through us.
  for (std::vector<std::string> odd : {std::vector<std::string>{"compile"}, {"compile", "--output"}, {"list-operators"}}) {
    auto mine = env, theirs = env;
    mine.push_back("neuronx-cc");
    theirs.push_back((real / "neuronx-cc").string());  // the argv[0] the shim hands on
    mine.insert(mine.end(), odd.begin(), odd.end());
    theirs.insert(theirs.end(), odd.begin(), odd.end());
    auto m = test::run(mine), t = test::run(theirs);
    CAPTURE(odd);
    CHECK(m.exit_code == t.exit_code);
    CHECK(m.output == t.output);
  }
  CHECK_FALSE(fs::exists(cache));
  // No real compiler but the shim itself: one line, the status a shell gives a missing command.
  auto alone = jit_env(cache, log, path_with({k_shim_dir}));
  alone.insert(alone.end(), {"neuronx-cc", "--version"});
  auto r = test::run(alone);
  CHECK(r.exit_code == 127);
  CHECK(r.output.starts_with("neffcache-cc: error: no real neuronx-cc on PATH"));
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  auto loop = jit_env(cache, log, path_with({k_shim_dir, real}));
  loop.insert(loop.end(), {"NEFFCACHE_REAL_COMPILER=" + (k_shim_dir / "neuronx-cc").string(), "neuronx-cc", "-V"});
  r = test::run(loop);
  CHECK(r.exit_code == 127);
  CHECK(r.output.find("is neffcache-cc itself") != std::string::npos);
}

TEST_CASE("neffcache-cc: a hit prints what the compiler prints and writes the log asked for; a cache it cannot use "
          "costs one warning, never the compile",
          "[shim]") {
  test::TempDir dir;
  const fs::path real = real_compiler_dir(dir);
  const fs::path log = dir / "compiles.log", hlo = dir / "graph.pb";
  fs::copy_file(test::k_corpus / "gopjrt_x_squared.hlo.pb", hlo);
  auto compile = [&](const fs::path& cache, const fs::path& out, std::vector<std::string> more = {}) {
    auto argv = jit_env(cache, log, path_with({k_shim_dir, real}));
    argv.insert(argv.end(), {"neuronx-cc", "compile", hlo.string(), "--framework", "XLA", "--target", "trn2", "--output",
                             out.string()});
    argv.insert(argv.end(), more.begin(), more.end());
    return test::run(argv);
  };
  SECTION("a hit") {
    const fs::path cache = dir / "cache";
    auto first = compile(cache, dir / "1.neff", {"-O1"});
    REQUIRE(first.exit_code == 0);
    CHECK(test::count_lines(log) == 1);
    auto second = compile(cache, dir / "2.neff", {"--logfile", (dir / "2.log").string(), "-O1", "--verbose=35"});
    CHECK(second.exit_code == 0);
    CHECK(test::count_lines(log) == 1);
    CHECK(second.output.find("Compiler status PASS\n") != std::string::npos);
    CHECK(test::slurp(dir / "2.neff") == test::slurp(dir / "1.neff"));
    CHECK(test::slurp(dir / "2.log").find("Compiler status PASS") != std::string::npos);
    // Other flags or another target are another result.
    CHECK(compile(cache, dir / "3.neff", {"-O2"}).exit_code == 0);
    CHECK(test::count_lines(log) == 2);
  }
  SECTION("a cache that cannot be made") {
    test::spit(dir / "file", "");
    auto r = compile(dir / "file" / "cache", dir / "1.neff");
    CHECK(r.exit_code == 0);
    CHECK(test::count_lines(log) == 1);
    CHECK(fs::file_size(dir / "1.neff") > 0);
    CHECK(r.output.starts_with("neffcache-cc: warning: "));
  }
  SECTION("an input that is no HLO: the real compiler's own failure") {
    test::spit(hlo, "not a graph");
    auto r = compile(dir / "cache", dir / "1.neff");
    auto argv = jit_env(dir / "cache", log, path_with({real}));
    argv.insert(argv.end(), {"neuronx-cc", "compile", hlo.string(), "--framework", "XLA", "--target", "trn2", "--output",
                             (dir / "1.neff").string()});
    auto t = test::run(argv);
    CHECK(t.exit_code != 0);
    CHECK(r.exit_code == t.exit_code);
    CHECK(r.output.starts_with("neffcache-cc: warning: "));
    CHECK(r.output.find(t.output) != std::string::npos);
  }
}

TEST_CASE("neffcache-cc never waits for the entry its caller holds locked", "[shim]") {
  // A client that names entries by our key, with --target first in its flags: its entry
  // is the shim's own, whose lock it holds while it runs the compiler.
  test::TempDir dir;
  const fs::path real = real_compiler_dir(dir);
  const fs::path cache = dir / "cache", log = dir / "compiles.log";
  auto argv = jit_env(cache, log, path_with({k_shim_dir, real}));
  argv.insert(argv.end(), {test::k_sim, "--flag=--target=trn1", "--flag=-O1", "--max-wait", "20",
                           (test::k_corpus / "gopjrt_tuple.hlo.pb").string()});
  auto r = test::run(argv);
  CHECK(r.exit_code == 0);
  CHECK(test::count_lines(log) == 1);
  CHECK(r.output.find("1 compiled here") != std::string::npos);
}

TEST_CASE("neffcache-cc leaves the host's memory to a compile that has waited longer, as the scheduler does",
          "[shim][memory]") {
  using namespace std::chrono_literals;
  constexpr uint64_t MiB = 1 << 20;
  test::TempDir dir;
  const fs::path real = real_compiler_dir(dir);
  const fs::path cache = dir / "cache", log = dir / "compiles.log";
  const std::string ledger_dir = (dir / "ledger").string();
  auto env = jit_env(cache, log, path_with({k_shim_dir, real}));
  env.insert(env.end(), {"NEFFCACHE_MEM_LEDGER=" + ledger_dir, "NEFFCACHE_MEM_BUDGET=1GiB"});
  // Another process of the host holds nothing and waits for 900 MiB. The shim's graph,
  // never compiled before, is predicted to need the whole budget: it would not leave the
  // 900 MiB, so it waits behind the claim, though nothing is held.
  test::WaitingClaim other(ledger_dir, 1024 * MiB, 900 * MiB);
  auto rank = test::start_jit(env, {test::k_corpus / "gopjrt_tuple.hlo.pb"});
  // Until the shim has said in the ledger that it waits too (and a while after), the real
  // compiler does not run.
  CHECK(other.hold_until_shim_waits());
  other.hold(1000ms);
  CHECK(test::count_lines(log) == 0);
  other.set(0);  // the other process took its memory elsewhere: the shim compiles
  auto summary = test::summary_of(*rank);
  CHECK(summary["failed"] == 0);
  CHECK(test::count_lines(log) == 1);
}

TEST_CASE("neffcache-cc over a neffcachefs mount hands its compiles to the daemon: twins compile nowhere, a new "
          "graph once for four ranks",
          "[shim][fuse]") {
  fusetest::Mount m;
  test::TempDir dir;
  const fs::path real = real_compiler_dir(dir);
  const test::JitGraphs g = test::jit_graphs(dir);
  const fs::path &a = g.a, &a2 = g.a2, &c = g.c;
  // The shim's real compiles and the daemon's go to one log.
  const auto env = jit_env(m.mnt(), m.compile_log(), path_with({k_shim_dir, real}));
  CHECK(test::sum_of(test::train_jit(test::ranks_of(4, env), {a}), "failed") == 0);
  CHECK(m.compiles() == 1);
  auto second = test::train_jit(test::ranks_of(4, env), {a2, c});
  CHECK(test::sum_of(second, "failed") == 0);
  for (const auto& s : second)
    for (const auto& g : s["per_graph"]) CHECK(g["neff_bytes"].get<int>() > 0);
  CHECK(m.compiles() == 2);  // the new graph; the twin was the daemon's to serve
  // The daemon compiled our entries (its log names their work copies), the clients none.
  CHECK(test::slurp(m.compile_log()).find("MODULE_" + fusetest::canonical_of("gopjrt_tuple.hlo.pb").substr(0, 20)) !=
        std::string::npos);
}
