// Caches that must not compile or cannot be written, on real mounts: --no-compile
// refuses a miss at once and still serves hits and known equal graphs.
#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

TEST_CASE("mounted with --no-compile, a miss fails at once with EIO and a counted, logged refusal; hits and twins are served",
          "[fuse][layers]") {
  test::TempDir shared;
  const fs::path backing = shared.path() / "cache";
  std::string done;
  {
    Mount m({}, {}, backing);
    done = m.entry("rocm08_normal_9.hlo_proto.pb", "done+0");
    REQUIRE(read_all(m.mnt() / done / "model.neff").first == 0);
    REQUIRE(m.compiles() == 1);
  }
  Mount m({"NEFFCACHE_FAKE_SECONDS=5"}, {"--no-compile"}, backing);
  auto miss = m.entry("gopjrt_tuple.hlo.pb", "miss+0");
  const auto before = test::snapshot_tree(m.backing() / miss);
  auto start = std::chrono::steady_clock::now();
  CHECK(reader_process(m.mnt() / miss / "model.neff")->wait() == 5);  // EIO
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  CHECK(m.compiles() == 0);
  CHECK(test::snapshot_tree(m.backing() / miss) == before);  // no log, no lock, no failure record
  auto j = nlohmann::json::parse(read_all(m.mnt() / ".neffcache" / "stats.json").second);
  CHECK(j["refused"] == 1);
  CHECK(j["eio"]["07"] == 1);
  // Refused, not recorded: the entry still shows what opening it would produce.
  CHECK(fs::exists(m.mnt() / miss / "model.neff"));
  // A hit, and an entry of the same graph under another name (the content index), are served.
  CHECK(reader_process(m.mnt() / done / "model.neff")->wait() == 0);
  auto twin = m.entry("rocm08_normal_9.hlo_proto.pb", "twin+0");
  CHECK(reader_process(m.mnt() / twin / "model.neff")->wait() == 0);
  CHECK(test::slurp(m.backing() / twin / "model.neff") == test::slurp(m.backing() / done / "model.neff"));
  CHECK(m.compiles() == 0);
}
