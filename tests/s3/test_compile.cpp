// Compiles of S3 cache entries: under a lease, published NEFF first and model.done last,
// exactly once across concurrent compilers, and finished by another compiler when a
// holder dies or loses its lease.
#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/core/detail/sys.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/lease.hpp>

#include "s3_support.hpp"
#include "support.hpp"

using namespace s3test;  // the library, chrono literals, ContainsSubstring, fs, k_fake_template

namespace {

std::string rel_of(int i) { return test::fake_entry(i, 1000); }

void put_entries(S3Client& s3, const std::string& prefix, int n) { test::put_pending_entries(s3, prefix, n, 1000); }

std::map<std::string, std::string> objects(S3Client& s3) {
  auto l = s3.list("");
  REQUIRE(l.has_value());
  std::map<std::string, std::string> out;
  for (const auto& o : l->objects) out[o.key] = o.etag;
  return out;
}


CompileSettings fake_settings() {
  CompileSettings s;
  s.compiler = *CompilerTemplate::parse(k_fake_template);
  return s;
}

}  // namespace

TEST_CASE("neffcache compile on an s3:// cache compiles every pending entry and publishes done last",
          "[s3][compile]") {
  auto s3 = test::fresh_bucket("compile");
  put_entries(*s3, "team", 4);
  test::TempDir dir;
  auto log = dir / "fake.log";
  std::string url = fmt::format("s3://{}/team", s3->bucket());
  auto r = test::run(test::s3_tool_argv({"compile", "--cache", url, "--compiler", k_fake_template, "-j", "2"},
                               {"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_LOG=" + log.string(),
                                "NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_ONLY=MODULE_1003"}));
  INFO(r.output);
  CHECK(r.exit_code == 1);  // one graph failed
  auto have = objects(*s3);
  for (int i = 0; i < 3; ++i) {
    CHECK(have.contains("team/" + rel_of(i) + "/model.neff"));
    CHECK(have.contains("team/" + rel_of(i) + "/model.done"));
    CHECK_FALSE(have.contains("team/" + rel_of(i) + "/model.hlo_module.pb.lock"));  // done: deleted
  }
  CHECK(have.contains("team/" + rel_of(3) + "/model.log"));
  CHECK_FALSE(have.contains("team/" + rel_of(3) + "/model.neff"));
  CHECK_FALSE(have.contains("team/" + rel_of(3) + "/model.done"));
  // The NEFF is the compiler's output for that graph.
  test::TempDir got;
  REQUIRE(s3->download("team/" + rel_of(0) + "/model.neff", (got / "n").string()).has_value());
  CHECK(fs::file_size(got / "n") > 0);

  auto ls = test::run(test::s3_tool_argv({"ls", "--cache", url}, {}));
  CHECK(ls.exit_code == 0);
  CHECK(std::count(ls.output.begin(), ls.output.end(), '\n') == 5);
  CHECK_THAT(ls.output, ContainsSubstring("failed"));
  auto scan = test::run(test::s3_tool_argv({"scan", "--cache", url}, {}));
  CHECK_THAT(scan.output, ContainsSubstring("remaining items are 0, locked are 0, failed are 1, done are 3, total is 4"));

  // Nothing left to do: a second run compiles nothing.
  auto again = test::run(test::s3_tool_argv({"compile", "--cache", url, "--compiler", k_fake_template},
                                   {"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_LOG=" + log.string()}));
  CHECK(again.exit_code == 0);
  CHECK(test::count_lines(log) == 4);
}

TEST_CASE("two compilers on one S3 cache compile every entry exactly once", "[s3][compile]") {
  auto s3 = test::fresh_bucket("twohosts");
  const int n = 8;
  put_entries(*s3, "", n);
  test::TempDir dir;
  auto log = dir / "fake.log";
  fs::create_directories(dir / "exclusive");
  std::string url = fmt::format("s3://{}", s3->bucket());
  std::vector<std::string> env{"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_SECONDS=0.3", "NEFFCACHE_FAKE_IDLE=1",
                               "NEFFCACHE_FAKE_LOG=" + log.string(),
                               "NEFFCACHE_FAKE_EXCLUSIVE_DIR=" + (dir / "exclusive").string()};
  auto argv = test::s3_tool_argv({"compile", "--cache", url, "--compiler", k_fake_template, "-j", "4", "--json"}, env);
  test::Child a(argv), b(argv);
  std::string out_a = a.rest(), out_b = b.rest();
  INFO(out_a << out_b);
  CHECK(a.wait() == 0);
  CHECK(b.wait() == 0);
  test::check_compiled_once(log, dir / "exclusive", n);
  auto have = objects(*s3);
  for (int i = 0; i < n; ++i) CHECK(have.contains(rel_of(i) + "/model.done"));
}

TEST_CASE("a dead holder's S3 lease expires and another compiler finishes the entry", "[s3][compile]") {
  auto s3 = test::fresh_bucket("deadholder");
  put_entries(*s3, "", 1);
  // A holder that died mid-compile: its lease, never renewed.
  auto dead = S3Lease::acquire(*s3, rel_of(0) + "/model.hlo_module.pb.lock", 2s, "dead-host");
  REQUIRE(dead.has_value());
  test::TempDir dir;
  auto log = dir / "fake.log";
  auto t0 = std::chrono::steady_clock::now();
  auto r = test::run(test::s3_tool_argv({"compile", "--cache", fmt::format("s3://{}", s3->bucket()), "--compiler", k_fake_template},
                               {"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_LOG=" + log.string()}));
  auto took = std::chrono::steady_clock::now() - t0;
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK(took > 1s);  // it waited for the lease to expire
  CHECK(test::count_lines(log) == 1);
  CHECK(objects(*s3).contains(rel_of(0) + "/model.done"));
}

TEST_CASE("a compile whose S3 lease is taken over stops and publishes nothing", "[s3][compile]") {
  auto s3 = test::fresh_bucket("hijack");
  put_entries(*s3, "", 1);
  test::ScopedEnv slow("NEFFCACHE_FAKE_SECONDS", "4");
  test::ScopedEnv idle("NEFFCACHE_FAKE_IDLE", "1");
  bool stolen = false;
  std::thread thief([&] {
    // While the compile runs, another host takes the lease (as after a partition).
    std::this_thread::sleep_for(1500ms);
    auto key = rel_of(0) + "/model.hlo_module.pb.lock";
    auto held = read_lease(*s3, key);
    LeaseRecord other{"other-host", 1, "0123456789abcdef", 60s, false, 0};
    stolen = held && s3->put(key, detail::lease_json(other), {.if_match = held->etag}).has_value();
  });
  auto r = compile_s3_entry(*s3, "", rel_of(0), fake_settings(), {.lease_ttl = 8s});
  thief.join();
  REQUIRE(stolen);
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK_THAT(r.message, ContainsSubstring("lease lost"));
  auto have = objects(*s3);
  CHECK_FALSE(have.contains(rel_of(0) + "/model.neff"));
  CHECK_FALSE(have.contains(rel_of(0) + "/model.done"));
  // The other host's lease is untouched.
  CHECK(read_lease(*s3, rel_of(0) + "/model.hlo_module.pb.lock")->record->host == "other-host");
}

TEST_CASE("a NEFF that another writer replaces while it is uploaded gets no marker: the entry stays to compile",
          "[s3][compile]") {
  // upload_s3_result's safeguard, which every S3 publish goes through (compile_s3_entry,
  // and neffcache-cc's since issue 35, which uploaded without it): a NEFF still being
  // written must not become the entry's for every host. Another writer renames a new file
  // over the staged NEFF whenever it is opened; the upload opens it between its two looks.
  auto s3 = test::fresh_bucket("changed");
  put_entries(*s3, "", 1);
  std::atomic<int> replaced{0};
  sys::ScopedFaultHook hook([&](sys::Call call, std::string_view path) {
    if (call != sys::Call::open || !path.ends_with("/model.neff") || path.find("/neffcache-s3-") == std::string_view::npos)
      return 0;
    const std::string neff(path), other = neff + ".other";
    std::ofstream(other) << "another writer's NEFF";
    std::error_code ec;
    fs::rename(other, neff, ec);
    if (!ec) ++replaced;
    return 0;
  });
  auto r = compile_s3_entry(*s3, "", rel_of(0), fake_settings(), {.lease_ttl = 8s});
  CHECK(replaced > 0);
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK_THAT(r.message, ContainsSubstring("changed while it was uploaded"));
  auto have = objects(*s3);
  CHECK_FALSE(have.contains(rel_of(0) + "/model.done"));
  // Given back, not settled: another host compiles it.
  auto lease = read_lease(*s3, rel_of(0) + "/model.hlo_module.pb.lock");
  REQUIRE(lease);
  REQUIRE(lease->record);
  CHECK(lease->record->released);
}

TEST_CASE("neuron_parallel_compile's trial runs on an s3:// cache: collect, collect-and-compile, analyze",
          "[s3][compile]") {
  auto s3 = test::fresh_bucket("npc");
  test::TempDir dir;
  const fs::path log = dir / "fake.log";
  const std::string url = fmt::format("s3://{}/team", s3->bucket());
  // The client simulator stores the graphs in the bucket as graph extraction does.
  std::vector<std::string> trial{test::path::client_sim, "--extract-interval", "0.05", "--compiler-version", "2.21.0"};
  for (int i = 0; i < 3; ++i) trial.push_back(test::corpus_files()[static_cast<std::size_t>(i)].string());
  auto npc = [&](std::vector<std::string> args) {
    args.insert(args.end(), trial.begin(), trial.end());
    return test::run(test::s3_tool_argv(args, {"NEURON_COMPILE_CACHE_URL=" + url, "NEFFCACHE_FAKE_RATE=0",
                                               "NEFFCACHE_FAKE_LOG=" + log.string()}, test::path::npc));
  };
  auto count = [&](std::string_view suffix) {
    auto l = s3->list("team/");
    REQUIRE(l.has_value());
    return std::count_if(l->objects.begin(), l->objects.end(), [&](const auto& o) { return o.key.ends_with(suffix); });
  };

  auto collect = npc({"--command", "collect"});
  INFO(collect.output);
  CHECK(collect.exit_code == 0);
  CHECK_THAT(collect.output, ContainsSubstring("3 graphs extracted"));
  CHECK(count("/model.hlo_module.pb") == 3);
  CHECK(count("/model.neff") == 0);
  CHECK_FALSE(fs::exists(log));

  auto analyze = npc({"--command", "analyze", "--analyze-output", (dir / "analysis").string()});
  INFO(analyze.output);
  CHECK(analyze.exit_code == 0);
  auto result = nlohmann::json::parse(test::slurp(dir / "analysis" / "result.json"));
  CHECK(result["total"]["graphs"] == 3);
  CHECK(result["cache"] == url);

  auto both = npc({"--command", "collect-and-compile", "--compiler", k_fake_template, "--num_parallel", "2"});
  INFO(both.output);
  CHECK(both.exit_code == 0);
  CHECK_THAT(both.output, ContainsSubstring("Total successful compilations: 3"));
  CHECK(count("/model.neff") == 3);
  CHECK(count("/model.done") == 3);
  CHECK(test::count_lines(log) == 3);
}

TEST_CASE("an S3 entry's lease is renewed from the moment it is taken, through a long wait before any compile",
          "[s3][compile][pipeline]") {
  auto s3 = test::fresh_bucket("kept");
  put_entries(*s3, "", 1);
  test::TempDir work;
  S3Entry dest(*s3, "", rel_of(0), 2s);  // renewed every second
  HeldCompile how;
  how.look = [](const EntryFiles& files, bool) -> std::optional<CompileResult> {
    if (auto o = settled_outcome(files, false)) return CompileResult::of(*o);
    return std::nullopt;
  };
  int taken_by_another = 0;
  auto r = compile_held(dest, how, [&](const EntryFiles&, EntryHold&) {
    // Five seconds of waiting (for memory, for a download): another host tries meanwhile.
    for (int i = 0; i < 10; ++i) {
      std::this_thread::sleep_for(500ms);
      if (auto other = S3Lease::acquire(*s3, rel_of(0) + "/model.hlo_module.pb.lock", 60s, "other-host")) {
        ++taken_by_another;
        (void)other->release();
      }
    }
    Ran ran;
    ran.produced.neff = (work / "model.neff").string();
    std::ofstream(ran.produced.neff) << "neff";
    ran.result = CompileResult::of(CompileOutcome::success);
    return ran;
  });
  CHECK(taken_by_another == 0);
  CHECK(r.outcome == CompileOutcome::success);
  auto have = objects(*s3);
  CHECK(have.contains(rel_of(0) + "/model.neff"));
  CHECK(have.contains(rel_of(0) + "/model.done"));
  CHECK_FALSE(have.contains(rel_of(0) + "/model.hlo_module.pb.lock"));  // done: deleted
}

TEST_CASE("a compile farm of two --watch processes compiles each graph a trial run writes into the bucket once, "
          "and stops on SIGTERM",
          "[s3][compile][farm]") {
  auto s3 = test::fresh_bucket("farm");
  test::TempDir dir;
  auto log = dir / "fake.log";
  fs::create_directories(dir / "exclusive");
  const std::string url = fmt::format("s3://{}", s3->bucket());
  const std::vector<std::string> env{"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_SECONDS=0.3", "NEFFCACHE_FAKE_IDLE=1",
                                     "NEFFCACHE_FAKE_LOG=" + log.string(),
                                     "NEFFCACHE_FAKE_EXCLUSIVE_DIR=" + (dir / "exclusive").string()};
  auto argv = test::s3_tool_argv(
      {"compile", "--watch", "--watch-interval", "1", "--cache", url, "--compiler", k_fake_template, "-j", "2"}, env);
  test::Child farm_a(argv, /*quiet_stderr=*/true), farm_b(argv, /*quiet_stderr=*/true);
  // The trial run: 20 graphs, one after another, while the farm runs.
  const int n = 20;
  auto corpus = test::corpus_files();
  for (int i = 0; i < n; ++i) {
    const std::string rel = test::fake_entry(i, 1100);
    REQUIRE(s3->put(rel + "/compile_flags.json", R"(["--target=trn1"])").has_value());
    REQUIRE(s3->put(rel + "/model.hlo_module.pb", test::slurp(corpus[static_cast<std::size_t>(i)])).has_value());
    std::this_thread::sleep_for(50ms);
  }
  auto all_done = [&] {
    auto l = s3->list("");
    if (!l) return false;
    int done = 0;
    for (const auto& o : l->objects) done += o.key.ends_with("/model.done");
    return done == n;
  };
  bool done = false;
  for (int i = 0; i < 600 && !(done = all_done()); ++i) std::this_thread::sleep_for(100ms);
  CHECK(done);
  farm_a.kill(SIGTERM);
  farm_b.kill(SIGTERM);
  const std::string out = farm_a.rest() + farm_b.rest();
  INFO(out);
  CHECK(farm_a.wait() == 0);
  CHECK(farm_b.wait() == 0);
  test::check_compiled_once(log, dir / "exclusive", n);
  // Each result said once, by the farm process that compiled it.
  CHECK(std::count(out.begin(), out.end(), '\n') >= n);
}
