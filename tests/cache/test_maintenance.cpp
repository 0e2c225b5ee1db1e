// Changing entries while others use the cache: clearing failures, locks and results,
// removing entries, and checking a published NEFF against its record. Each change is
// made under the entry lock and refused (Errc::busy) while someone else holds it.
#include <sys/file.h>
#include <fcntl.h>
#include <unistd.h>

#include <map>

#include <catch2/catch_test_macros.hpp>
#include <fmt/format.h>

#include <neffcache/cache/maintenance.hpp>

#include "lnl.hpp"
#include "support.hpp"

using namespace neffcache;
namespace fs = std::filesystem;

namespace {

const std::string k_neff_bytes(4096, 'n');

// An entry folder with an HLO and flags and, by `state`, its results.
fs::path make_state_entry(const test::TempDir& root, EntryState state) {
  fs::path dir = root / "neuronxcc-2.21.0" / "MODULE_1+aa";
  fs::create_directories(dir);
  test::spit(dir / "model.hlo_module.pb", "hlo");
  test::spit(dir / "compile_flags.json", "[]");
  if (state == EntryState::failed) test::spit(dir / "model.log", "error: no\n");
  if (state == EntryState::done) {
    test::spit(dir / "model.neff", k_neff_bytes);
    test::spit(dir / "model.done", "");
    auto hash = detail::file_xxh3((dir / "model.neff").string());
    REQUIRE(hash.has_value());
    test::spit(dir / std::string(k_meta_file), fmt::format(R"({{"size": {}, "xxh3": "{:016x}"}})", k_neff_bytes.size(), *hash));
  }
  return dir;
}

// Holds the entry's lock, as a compile in another process would.
EntryLock hold_lock(const fs::path& dir) {
  auto files = read_entry_files(dir.string());
  REQUIRE(files.has_value());
  auto lock = EntryLock::try_acquire(entry_lock_path(dir.string(), *files));
  REQUIRE(lock.has_value());
  return std::move(*lock);
}

EntryState state_of_dir(const fs::path& dir) {
  auto files = read_entry_files(dir.string());
  REQUIRE(files.has_value());
  return classify(*files, [] { return true; });
}

// The names in an entry folder with their contents.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& f : fs::directory_iterator(dir)) out[f.path().filename().string()] = test::slurp(f.path());
  return out;
}

// Runs `change` while another holder has the entry's lock: it is refused as busy and
// leaves every file as it was.
template <class Change>
void check_refused_while_held(const fs::path& dir, Change change) {
  auto held = hold_lock(dir);
  auto before = snapshot(dir);
  auto r = change();
  REQUIRE_FALSE(r);
  CHECK(r.error().code == Errc::busy);
  CHECK(snapshot(dir) == before);
}

}  // namespace

TEST_CASE("clearing a failure makes the entry pending; an entry without one is left alone", "[maintenance]") {
  test::TempDir root;
  auto dir = make_state_entry(root, EntryState::failed);
  auto e = EntryPaths::plain(dir.string());
  check_refused_while_held(dir, [&] { return clear_failure(e); });
  auto cleared = clear_failure(e);
  REQUIRE(cleared.has_value());
  CHECK(*cleared);
  CHECK_FALSE(fs::exists(dir / "model.log"));
  CHECK(fs::exists(dir / "model.hlo_module.pb"));
  CHECK(state_of_dir(dir) == EntryState::pending);
  auto again = clear_failure(e);
  REQUIRE(again.has_value());
  CHECK_FALSE(*again);
}

TEST_CASE("clearing a lock refuses a live one and says when there is none", "[maintenance]") {
  test::TempDir root;
  auto dir = make_state_entry(root, EntryState::pending);
  auto e = EntryPaths::plain(dir.string());
  auto none = clear_stale_lock(e);
  REQUIRE_FALSE(none);
  CHECK(none.error().code == Errc::not_found);
  check_refused_while_held(dir, [&] { return clear_stale_lock(e); });
}

TEST_CASE("clearing results keeps the graph and its flags: the entry is pending again", "[maintenance]") {
  test::TempDir root;
  auto dir = make_state_entry(root, EntryState::done);
  auto e = EntryPaths::plain(dir.string());
  check_refused_while_held(dir, [&] { return clear_results(e); });
  REQUIRE(clear_results(e).has_value());
  for (const char* gone : {"model.neff", "model.done", "model.log", ".neffcache-meta.json"})
    CHECK_FALSE(fs::exists(dir / gone));
  CHECK(test::slurp(dir / "model.hlo_module.pb") == "hlo");
  CHECK(test::slurp(dir / "compile_flags.json") == "[]");
  CHECK(state_of_dir(dir) == EntryState::pending);
  CHECK(clear_results(e).has_value());  // nothing left to clear is fine
}

TEST_CASE("removing an entry removes its folder, unless someone holds it", "[maintenance]") {
  test::TempDir root;
  auto dir = make_state_entry(root, EntryState::done);
  auto e = EntryPaths::plain(dir.string());
  check_refused_while_held(dir, [&] { return remove_entry(e); });
  REQUIRE(remove_entry(e).has_value());
  CHECK_FALSE(fs::exists(dir));
  CHECK(fs::exists(dir.parent_path()));  // the compiler folder stays
}

TEST_CASE("a published NEFF is checked against the size and checksum recorded for it", "[maintenance]") {
  test::TempDir root;
  auto dir = make_state_entry(root, EntryState::done);
  CHECK(verify_neff(dir.string()).check == NeffCheck::ok);

  // Same size, one byte changed: only the checksum can tell.
  std::string changed = k_neff_bytes;
  changed[100] = 'x';
  test::spit(dir / "model.neff", changed);
  auto v = verify_neff(dir.string());
  CHECK(v.check == NeffCheck::broken);
  CHECK(v.why.find("checksum") != std::string::npos);

  test::spit(dir / "model.neff", "short");
  v = verify_neff(dir.string());
  CHECK(v.check == NeffCheck::broken);
  CHECK(v.why.find("5 bytes") != std::string::npos);

  // No record (another tool published it): present and not empty is all we can say.
  fs::remove(dir / std::string(k_meta_file));
  CHECK(verify_neff(dir.string()).check == NeffCheck::unrecorded);
  test::spit(dir / "model.neff", "");
  CHECK(verify_neff(dir.string()).check == NeffCheck::broken);

  fs::remove(dir / "model.neff");
  v = verify_neff(dir.string());
  CHECK(v.check == NeffCheck::broken);
  CHECK(v.why == "model.done without model.neff");
}

namespace {

// A done LNL entry as we publish it: LNL's NEFF, compiler log and marker, our metadata.
fs::path make_done_lnl(const fs::path& root, const std::string& key) {
  auto dir = test::make_lnl_entry(root, "gopjrt_tuple.hlo.pb", key);
  test::spit(dir / lnl_neff_name(key), k_neff_bytes);
  test::spit(dir / "log-neuron-cc.txt", "Compiler status PASS\n");
  auto hash = detail::file_xxh3((dir / lnl_neff_name(key)).string());
  REQUIRE(hash.has_value());
  test::spit(dir / std::string(k_meta_file), fmt::format(R"({{"size": {}, "xxh3": "{:016x}"}})", k_neff_bytes.size(), *hash));
  test::spit(dir / ".compilation_complete", lnl_marker(1700000000, k_neff_bytes.size()));
  return dir;
}

}  // namespace

TEST_CASE("maintenance of an LNL entry names LNL's files and keeps its inputs and lock file", "[maintenance][lnl]") {
  test::TempDir root;
  const std::string key = test::lnl_key("maintenance");
  auto dir = make_done_lnl(root.path(), key);
  test::spit(test::lnl_lock(root.path(), key), "");  // a client's, left behind
  const auto e = EntryPaths::plain(dir.string());

  SECTION("clearing results removes the NEFF, marker, compiler log and metadata: pending again") {
    REQUIRE(clear_results(e).has_value());
    for (auto name : {lnl_neff_name(key), std::string(".compilation_complete"), std::string("log-neuron-cc.txt"),
                      std::string(k_meta_file)})
      CHECK_FALSE(fs::exists(dir / name));
    for (auto name : {"graph.hlo", "command.txt", ".artifact_metadata_v0.json"}) CHECK(fs::exists(dir / name));
    CHECK(fs::exists(test::lnl_lock(root.path(), key)));
    auto files = read_entry_files(dir.string());
    REQUIRE(files.has_value());
    CHECK(classify(*files, [] { return false; }) == EntryState::pending);
  }
  SECTION("a failure is our record; clearing it leaves the rest") {
    fs::remove(dir / ".compilation_complete");
    fs::remove(dir / lnl_neff_name(key));
    test::spit(dir / ".neffcache-failed.log", "error: no\n");
    CHECK(clear_failure(e).value() == true);
    CHECK_FALSE(fs::exists(dir / ".neffcache-failed.log"));
    CHECK(fs::exists(dir / "log-neuron-cc.txt"));
    CHECK(clear_failure(e).value() == false);
  }
  SECTION("a lock file nobody holds is nothing to clear; a held one is busy and stays") {
    auto none = clear_stale_lock(e);
    REQUIRE_FALSE(none.has_value());
    CHECK(none.error().code == Errc::not_found);
    CHECK(fs::exists(test::lnl_lock(root.path(), key)));
    int fd = ::open((test::lnl_lock(root.path(), key)).c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    auto busy = clear_stale_lock(e);
    REQUIRE_FALSE(busy.has_value());
    CHECK(busy.error().code == Errc::busy);
    CHECK(clear_results(e).error().code == Errc::busy);
    CHECK(fs::exists(dir / lnl_neff_name(key)));
    ::close(fd);
  }
  SECTION("removing the entry removes its folder and leaves the lock file beside it") {
    REQUIRE(remove_entry(e).has_value());
    CHECK_FALSE(fs::exists(dir));
    CHECK(fs::exists(test::lnl_lock(root.path(), key)));
  }
}

TEST_CASE("an LNL NEFF is checked against its marker's size and our record", "[maintenance][lnl]") {
  test::TempDir root;
  const std::string key = test::lnl_key("verify");
  auto dir = make_done_lnl(root.path(), key);
  const auto neff = dir / lnl_neff_name(key);
  CHECK(verify_neff(dir.string()).check == NeffCheck::ok);

  SECTION("a cut NEFF disagrees with the marker") {
    test::spit(neff, k_neff_bytes.substr(0, 100));
    auto v = verify_neff(dir.string());
    CHECK(v.check == NeffCheck::broken);
    CHECK(v.why == fmt::format("{} has 100 bytes, its .compilation_complete says {}", lnl_neff_name(key), k_neff_bytes.size()));
  }
  SECTION("a flipped byte: only our checksum can tell") {
    std::string bytes = k_neff_bytes;
    bytes[7] = 'x';
    test::spit(neff, bytes);
    auto v = verify_neff(dir.string());
    CHECK(v.check == NeffCheck::broken);
    CHECK(v.why.find(lnl_neff_name(key) + " has checksum") == 0);
  }
  SECTION("published by LNL: the marker's size is its record") {
    fs::remove(dir / std::string(k_meta_file));
    CHECK(verify_neff(dir.string()).check == NeffCheck::ok);
    test::spit(neff, "short");
    CHECK(verify_neff(dir.string()).check == NeffCheck::broken);
  }
  SECTION("our record of an older NEFF is not held against a client's newer one") {
    test::spit(neff, "a client's NEFF");
    test::spit(dir / ".compilation_complete", lnl_marker(1800000000, 15));
    CHECK(verify_neff(dir.string()).check == NeffCheck::ok);
  }
  SECTION("a marker without a size, and no record: present and not empty is all we can say") {
    fs::remove(dir / std::string(k_meta_file));
    test::spit(dir / ".compilation_complete", "");
    CHECK(verify_neff(dir.string()).check == NeffCheck::unrecorded);
  }
  SECTION("a marker without its NEFF") {
    fs::remove(neff);
    CHECK(verify_neff(dir.string()).why == ".compilation_complete without " + lnl_neff_name(key));
  }
}
