// stats.json: counters readable while mounted, kept out of the backing folder, and the
// same document for the whole of one open; the metrics made of it.
#include <neffcache/store/metrics.hpp>

#include "fuse_test.hpp"
#include "metrics.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

TEST_CASE("counters are readable while mounted and are not in the backing store", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_x_squared.hlo.pb", "stats+0");
  CHECK(read_all(m.mnt() / e / "model.neff").first == 0);  // a miss: compiles
  CHECK(read_all(m.mnt() / e / "model.neff").first == 0);  // a hit
  auto [err, text] = read_all(m.mnt() / ".neffcache" / "stats.json");
  REQUIRE(err == 0);
  auto j = nlohmann::json::parse(text);
  CHECK(j["misses"] == 1);
  CHECK(j["hits"] == 1);
  CHECK(j["waiters"] == 0);
  CHECK(j["compiles"]["started"] == 1);
  CHECK(j["compiles"]["succeeded"] == 1);
  CHECK(j["entries"]["done"] == 1);
  CHECK(j["eio"]["01"] == 0);
  CHECK_FALSE(fs::exists(m.backing() / ".neffcache" / "stats.json"));
  CHECK(fs::is_directory(m.backing() / ".neffcache" / "index"));  // the content index is (see test_twins.cpp)
  int fd = ::open((m.mnt() / ".neffcache" / "stats.json").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  CHECK(::fsync(fd) == 0);
  CHECK(::close(fd) == 0);  // its handle is no descriptor: flush must not treat it as one
  CHECK(::open((m.mnt() / ".neffcache" / "stats.json").c_str(), O_WRONLY) < 0);
  CHECK(errno == EACCES);
  CHECK(::mkdir((m.mnt() / ".neffcache" / "x").c_str(), 0755) < 0);
}

TEST_CASE("stats.json read in pieces while counters move is the document of its open", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_x_squared.hlo.pb", "pieces+0");
  REQUIRE(read_all(m.mnt() / e / "model.neff").first == 0);  // a miss
  int fd = ::open((m.mnt() / ".neffcache" / "stats.json").c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  char buf[7];
  std::string text(buf, static_cast<std::size_t>(std::max<ssize_t>(0, ::read(fd, buf, sizeof buf))));
  for (int i = 0; i < 12; ++i) REQUIRE(read_all(m.mnt() / e / "model.neff").first == 0);  // hits: 0 -> 12
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) text.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  REQUIRE(nlohmann::json::accept(text));
  CHECK(nlohmann::json::parse(text)["hits"] == 0);  // as at the open, not pieces of a later text
  CHECK(nlohmann::json::parse(read_all(m.mnt() / ".neffcache" / "stats.json").second)["hits"] == 12);
}

// The metrics an operator's monitoring reads (docs/METRICS.md): the daemon's file and
// `neffcache stats --format prometheus` move as a hit, a compile and a failure go through
// the mount, and Prometheus' own checker accepts both texts.
TEST_CASE("metrics: the daemon's file and neffcache stats count a hit, a compile and a failure", "[fuse][metrics]") {
  test::TempDir out;
  const fs::path file = out.path() / "neffcache.prom";
  Mount m({"NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_ONLY=MODULE_bad"},
          {"--metrics-file", file.string(), "--metrics-interval", "0.1"});
  REQUIRE(fs::exists(file));  // written once the mount is up
  const auto before = test::parse_metrics(test::slurp(file));
  const std::string mount = fmt::format("mount=\"{}\"", m.mnt().string());
  CHECK(before.value("neffcache_hits_total", mount) == 0);
  CHECK(before.value("neffcache_build_info", "version=\"") == 1);

  auto good = m.entry("gopjrt_x_squared.hlo.pb", "good+0");
  auto bad = m.entry("gopjrt_tuple.hlo.pb", "bad+0");
  auto [miss, neff] = read_all(m.mnt() / good / "model.neff");  // compiles
  REQUIRE(miss == 0);
  REQUIRE(read_all(m.mnt() / good / "model.neff").first == 0);  // a hit
  REQUIRE(read_all(m.mnt() / bad / "model.neff").first == EIO);  // the compiler refuses it

  // The file catches up within an interval or two (30 s at most, on a loaded machine): one
  // written after the failing open was answered (a compile is counted as finished before its
  // waiters are answered, and a file written in between shows the one and not the other).
  test::Metrics after;
  for (int i = 0; i < 600; ++i) {
    after = test::parse_metrics(test::slurp(file));
    if (after.value("neffcache_compiles_finished_total", "result=\"failed\"") == 1 &&
        after.value("neffcache_eio_total", "site=\"01\"") == 1 && after.value("neffcache_opens_waiting", mount) == 0)
      break;
    std::this_thread::sleep_for(50ms);
  }
  CHECK(after.value("neffcache_hits_total", mount) == 1);
  CHECK(after.value("neffcache_misses_total", mount) == 2);
  CHECK(after.value("neffcache_compiles_started_total", mount) == 2);
  CHECK(after.value("neffcache_compiles_finished_total", "result=\"succeeded\"") == 1);
  CHECK(after.value("neffcache_compiles_finished_total", "result=\"failed\"") == 1);
  CHECK(after.value("neffcache_compiles_finished_total", "result=\"transient\"") == 0);
  CHECK(after.value("neffcache_eio_total", "site=\"01\"") == 1);
  CHECK(after.value("neffcache_read_bytes_total", mount) >= 2.0 * static_cast<double>(neff.size()));
  CHECK(after.value("neffcache_compile_seconds_total", mount) > 0);
  CHECK(after.value("neffcache_opens_waiting", mount) == 0);

  auto tool = test::run_tool({"stats", "--cache", m.mnt().string(), "--format", "prometheus"});
  REQUIRE(tool.exit_code == 0);
  const auto listed = test::parse_metrics(tool.output);
  CHECK(listed.value("neffcache_hits_total", mount) == 1);  // the daemon's, labelled alike
  CHECK(listed.value("neffcache_compiles_finished_total", "result=\"failed\"") == 1);
  CHECK(listed.value("neffcache_cache_entries", "state=\"done\"") == 1);
  CHECK(listed.value("neffcache_cache_entries", "state=\"failed\"") == 1);

  // Every metric of the tables with its type, but those of parts this mount lacks (S3: see
  // test_s3_mount.cpp).
  for (const auto* table : {&store::daemon_metrics(), &store::cache_metrics()})
    for (const auto& spec : *table) {
      const std::string name(spec.name);
      if (name.starts_with("neffcache_s3_")) continue;
      INFO(name);
      CHECK(listed.types.count(name) == 1);
      CHECK((listed.types.count(name) == 1 && listed.types.at(name) == spec.type));
      if (table == &store::daemon_metrics()) CHECK(after.types.count(name) == 1);
    }
  for (const auto& text : {test::slurp(file), tool.output}) {
    auto checked = test::promtool_check(text, out.path());
    INFO(checked.output);
    CHECK(checked.exit_code == 0);
  }
}
