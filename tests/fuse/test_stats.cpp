// stats.json: counters readable while mounted, kept out of the backing folder, and the
// same document for the whole of one open.
#include "fuse_test.hpp"

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
