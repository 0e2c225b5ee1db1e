// What a cache holds (list_entries, count_entries) and what gc removes (plan_gc), on
// folders made by hand and on entry lists made up for the plan.
#include <fcntl.h>
#include <sys/stat.h>

#include <chrono>
#include <map>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/cache/inventory.hpp>

#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using time_point = std::chrono::system_clock::time_point;
const time_point k_t0 = time_point{} + std::chrono::hours(24 * 365 * 50);

EntryInfo info(std::string path, EntryState state, uint64_t bytes, time_point last_use) {
  EntryInfo e;
  e.path = std::move(path);
  e.state = state;
  e.bytes = bytes;
  e.last_use = last_use;
  return e;
}

// Sets a file's access and change times to `t` seconds since the epoch.
void set_times(const fs::path& p, time_t atime, time_t mtime) {
  struct timespec ts[2] = {{atime, 0}, {mtime, 0}};
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), ts, AT_SYMLINK_NOFOLLOW) == 0);
}

}  // namespace

TEST_CASE("gc plans nothing for a cache that fits", "[gc]") {
  std::vector<EntryInfo> es{info("neuronxcc-2/MODULE_a", EntryState::done, 100, k_t0),
                            info("neuronxcc-2/MODULE_b", EntryState::done, 100, k_t0 + 1s)};
  CHECK(plan_gc(es, 200, 0).empty());
  CHECK(plan_gc({}, 0, 0).empty());
}

TEST_CASE("gc removes done entries least recently used first, only until the rest fits", "[gc]") {
  std::vector<EntryInfo> es{info("neuronxcc-2/MODULE_new", EntryState::done, 100, k_t0 + 30s),
                            info("neuronxcc-2/MODULE_old", EntryState::done, 100, k_t0),
                            info("neuronxcc-2/MODULE_mid", EntryState::done, 100, k_t0 + 10s)};
  CHECK(plan_gc(es, 250, 0) == std::vector<std::size_t>{1});
  CHECK(plan_gc(es, 200, 0) == std::vector<std::size_t>{1});  // exactly at the limit fits
  CHECK(plan_gc(es, 199, 0) == (std::vector<std::size_t>{1, 2}));
  CHECK(plan_gc(es, 0, 0) == (std::vector<std::size_t>{1, 2, 0}));
}

TEST_CASE("gc never chooses an entry that is not done by size, however old", "[gc]") {
  std::vector<EntryInfo> es{info("neuronxcc-2/MODULE_p", EntryState::pending, 1000, k_t0),
                            info("neuronxcc-2/MODULE_c", EntryState::compiling, 1000, k_t0),
                            info("neuronxcc-2/MODULE_f", EntryState::failed, 1000, k_t0),
                            info("neuronxcc-2/MODULE_s", EntryState::stale_lock, 1000, k_t0),
                            info("neuronxcc-2/MODULE_d", EntryState::done, 10, k_t0 + 1h)};
  // Over the limit even with every done entry gone: the rest stays.
  CHECK(plan_gc(es, 100, 0) == std::vector<std::size_t>{4});
}

TEST_CASE("gc drops whole compiler folders beyond the most recently used ones first", "[gc]") {
  std::vector<EntryInfo> es{info("neuronxcc-1/MODULE_a", EntryState::pending, 10, k_t0),
                            info("neuronxcc-3/MODULE_b", EntryState::done, 10, k_t0 + 3h),
                            info("neuronxcc-2/MODULE_c", EntryState::done, 10, k_t0 + 2h),
                            info("neuronxcc-1/MODULE_d", EntryState::done, 10, k_t0 + 1h),
                            info("neuronxcc-2/MODULE_e", EntryState::failed, 10, k_t0)};
  // Keep 1: every entry of neuronxcc-2 and -1 goes, whatever its state, in list order.
  CHECK(plan_gc(es, 1000, 1) == (std::vector<std::size_t>{0, 2, 3, 4}));
  // Keep 2: neuronxcc-1 goes (last used at +1h, before -2's +2h).
  CHECK(plan_gc(es, 1000, 2) == (std::vector<std::size_t>{0, 3}));
  // 0 keeps every folder; then size: done entries, oldest first.
  CHECK(plan_gc(es, 1000, 0).empty());
  CHECK(plan_gc(es, 25, 2) == (std::vector<std::size_t>{0, 3, 2}));
}

TEST_CASE("gc keeps LNL entries whatever --keep-compilers says, and evicts them by size as any done entry", "[gc][lnl]") {
  const std::string lnl_old(32, 'a'), lnl_new(32, 'b');
  std::vector<EntryInfo> es{info("neuronxcc-1/MODULE_a", EntryState::done, 10, k_t0 + 1h),
                            info(lnl_old, EntryState::done, 10, k_t0),
                            info("neuronxcc-2/MODULE_b", EntryState::done, 10, k_t0 + 2h),
                            info(lnl_new, EntryState::pending, 10, k_t0 + 3h)};
  es[1].files = EntryFiles::lnl(lnl_old);
  es[3].files = EntryFiles::lnl(lnl_new);
  // Keep 1 compiler: only neuronxcc-1 goes; no LNL entry counts as a compiler of its own.
  CHECK(plan_gc(es, 1000, 1) == std::vector<std::size_t>{0});
  // By size: the least recently used done entry first, of either dialect; pending stays.
  CHECK(plan_gc(es, 25, 0) == (std::vector<std::size_t>{1, 0}));
}

TEST_CASE("an inventory lists every entry with its state, sizes, compile time and last use", "[inventory]") {
  test::TempDir root;
  const fs::path done = root / "neuronxcc-2.21.0" / "MODULE_1+aa";
  const fs::path pending = root / "neuronxcc-2.21.0" / "MODULE_2+bb";
  const fs::path failed = root / "neuronxcc-2.20.0" / "MODULE_3+cc";
  fs::create_directories(done);
  fs::create_directories(pending);
  fs::create_directories(failed);
  test::spit(done / "model.hlo_module.pb", std::string(100, 'h'));
  test::spit(done / "model.neff", std::string(1000, 'n'));
  test::spit(done / "model.done", "");
  test::spit(done / std::string(k_meta_file), R"({"compile_seconds": 12.5})");
  set_times(done / "model.neff", 2'000'000'000, 1'900'000'000);  // read after it was published
  test::spit(pending / "model.hlo_module.pb", std::string(50, 'h'));
  test::spit(failed / "model.hlo_module.pb", std::string(30, 'h'));
  test::spit(failed / "model.log", "error\n");
  set_times(failed / "model.hlo_module.pb", 1'000'000'000, 1'000'000'000);
  set_times(failed / "model.log", 1'000'000'000, 1'100'000'000);

  auto listed = list_entries(root.path().string());
  REQUIRE(listed.has_value());
  std::map<std::string, EntryInfo> by_path;
  for (auto& e : *listed) by_path[e.path] = e;
  REQUIRE(by_path.size() == 3);

  const auto& d = by_path.at("neuronxcc-2.21.0/MODULE_1+aa");
  CHECK(d.state == EntryState::done);
  CHECK(d.neff_bytes == 1000);
  CHECK(d.bytes == 100 + 1000 + std::string(R"({"compile_seconds": 12.5})").size());
  CHECK(d.compile_seconds == 12.5);
  CHECK(d.last_use == std::chrono::system_clock::from_time_t(2'000'000'000));

  const auto& p = by_path.at("neuronxcc-2.21.0/MODULE_2+bb");
  CHECK(p.state == EntryState::pending);
  CHECK(p.neff_bytes == 0);
  CHECK(p.bytes == 50);
  CHECK_FALSE(p.compile_seconds);

  const auto& f = by_path.at("neuronxcc-2.20.0/MODULE_3+cc");
  CHECK(f.state == EntryState::failed);
  CHECK(f.bytes == 36);
  // Without a NEFF, the newest change of any file.
  CHECK(f.last_use == std::chrono::system_clock::from_time_t(1'100'000'000));

  auto counts = count_entries(root.path().string());
  REQUIRE(counts.has_value());
  CHECK(counts->done == 1);
  CHECK(counts->pending == 1);
  CHECK(counts->failed == 1);
  CHECK(counts->total() == 3);
  CHECK(counts->remaining(false) == 1);
  CHECK(counts->remaining(true) == 2);
}

TEST_CASE("an inventory of a folder that is missing is an error, of an empty one nothing", "[inventory]") {
  test::TempDir root;
  CHECK(list_entries(root.path().string())->empty());
  CHECK(count_entries(root.path().string())->total() == 0);
  CHECK_FALSE(list_entries((root / "missing").string()));
  CHECK_FALSE(count_entries((root / "missing").string()));
}
