// The steps every compile of an entry takes (compile/pipeline.hpp) on a folder entry:
// the hold kept alive through the whole run, a lost hold publishing nothing, a held
// entry busy at once or waited for, and a result published or a failure recorded only
// under the hold.
#include <sys/stat.h>

#include <atomic>
#include <fstream>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>

#include <neffcache/compile/pipeline.hpp>

#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;
using Catch::Matchers::ContainsSubstring;

namespace {

// An entry folder with an HLO, under `root`.
std::string pending_entry(const test::TempDir& root) {
  auto dir = root / "neuronxcc-2.21.0" / "MODULE_1+abc";
  test::fs::create_directories(dir);
  std::ofstream(dir / std::string(k_hlo_module_file)) << "hlo";
  return dir.string();
}

// Looks as a compile does: done or failed entries need nothing.
HeldCompile settled_only() {
  HeldCompile how;
  how.look = [](const EntryFiles& files, bool) -> std::optional<CompileResult> {
    if (auto o = settled_outcome(files, false)) return CompileResult::of(*o);
    return std::nullopt;
  };
  return how;
}

// A run that "compiles" a NEFF into `work` after `wait`, as a compiler would.
RunStep producing(const test::TempDir& work, std::chrono::milliseconds wait = 0ms) {
  return [&work, wait](const EntryFiles&, EntryHold&) {
    std::this_thread::sleep_for(wait);
    Ran ran;
    ran.produced.neff = (work / "out.neff").string();
    std::ofstream(ran.produced.neff) << "neff";
    ran.result = CompileResult::of(CompileOutcome::success);
    return ran;
  };
}

std::chrono::nanoseconds mtime(const std::string& path) {
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  return std::chrono::seconds(st.st_mtim.tv_sec) + std::chrono::nanoseconds(st.st_mtim.tv_nsec);
}

}  // namespace

TEST_CASE("a compile's lock is beaten all through its run, however long the run waits before a compiler starts",
          "[compile][pipeline]") {
  test::TempDir root, work;
  const std::string entry = pending_entry(root);
  LockOptions opts;
  opts.stale_after = 400ms;  // a beat every 100 ms
  FolderEntry dest(entry, opts);
  const std::string lock = entry_lock_path(entry, *read_entry_files(entry));
  int beats = 0;
  auto r = compile_held(dest, settled_only(), [&](const EntryFiles& files, EntryHold& hold) {
    CHECK(hold.descriptor() >= 0);
    auto before = mtime(lock);
    for (int i = 0; i < 10; ++i) {  // 1 s: two and a half times the lock's staleness
      std::this_thread::sleep_for(100ms);
      auto now = mtime(lock);
      beats += now > before;
      before = now;
    }
    return producing(work)(files, hold);
  });
  CHECK(r.outcome == CompileOutcome::success);
  // (Beats every 100 ms, looked at every 100 ms: most looks see a new one.)
  CHECK(beats >= 5);
  CHECK(read_entry_files(entry)->done());
  CHECK_FALSE(test::fs::exists(lock));  // given back
}

TEST_CASE("a compile whose lock is taken from it publishes nothing and says why", "[compile][pipeline]") {
  test::TempDir root, work;
  const std::string entry = pending_entry(root);
  LockOptions opts;
  opts.stale_after = 200ms;
  FolderEntry dest(entry, opts);
  const std::string lock = entry_lock_path(entry, *read_entry_files(entry));
  auto r = compile_held(dest, settled_only(), [&](const EntryFiles& files, EntryHold& hold) {
    // Another process judged us dead: it removed our lock file and made its own.
    REQUIRE(::unlink(lock.c_str()) == 0);
    std::ofstream(lock) << "someone else";
    for (int i = 0; i < 50 && !hold.lost(); ++i) std::this_thread::sleep_for(20ms);
    CHECK(hold.lost());
    return producing(work)(files, hold);
  });
  CHECK(r.outcome == CompileOutcome::transient);
  CHECK_THAT(r.message, ContainsSubstring("was lost"));
  auto files = read_entry_files(entry);
  CHECK_FALSE(files->done());
  CHECK_FALSE(files->has(EntryFile::neff));
  CHECK(test::fs::exists(lock));  // the other's lock stays
}

TEST_CASE("a held entry is busy at once, or waited for and then served by what its holder left",
          "[compile][pipeline]") {
  test::TempDir root, work;
  const std::string entry = pending_entry(root);
  auto other = EntryLock::try_acquire_entry(entry, *read_entry_files(entry));
  REQUIRE(other.has_value());
  FolderEntry dest(entry);
  bool ran = false;
  auto run = [&](const EntryFiles& files, EntryHold& hold) {
    ran = true;
    return producing(work)(files, hold);
  };

  auto busy = compile_held(dest, settled_only(), run);
  CHECK(busy.outcome == CompileOutcome::busy);

  std::thread holder([&] {
    std::this_thread::sleep_for(300ms);
    std::ofstream(test::fs::path(entry) / "model.neff") << "neff";
    std::ofstream(test::fs::path(entry) / "model.done");
    other->release();
  });
  HeldCompile how = settled_only();
  how.wait_until = std::chrono::steady_clock::now() + 10s;
  auto waited = compile_held(dest, how, run);
  holder.join();
  CHECK(waited.outcome == CompileOutcome::already_done);
  CHECK_FALSE(ran);
}

TEST_CASE("a waited-for hold not given back by the deadline is busy, naming its holder", "[compile][pipeline]") {
  test::TempDir root, work;
  const std::string entry = pending_entry(root);
  auto other = EntryLock::try_acquire_entry(entry, *read_entry_files(entry));
  REQUIRE(other.has_value());
  FolderEntry dest(entry);
  HeldCompile how = settled_only();
  how.wait_until = std::chrono::steady_clock::now() + 300ms;
  auto r = compile_held(dest, how, producing(work));
  CHECK(r.outcome == CompileOutcome::busy);
  CHECK_THAT(r.message, ContainsSubstring("gave up waiting"));
  CHECK_THAT(r.message, ContainsSubstring("is locked"));
  CHECK_FALSE(read_entry_files(entry)->has(EntryFile::neff));
}

TEST_CASE("a failure is recorded under the hold; a transient end leaves the entry as it was", "[compile][pipeline]") {
  test::TempDir root, work;
  const std::string entry = pending_entry(root);
  FolderEntry dest(entry);
  auto failing = [&](CompileOutcome outcome) {
    return [&work, outcome](const EntryFiles&, EntryHold&) {
      Ran ran;
      ran.failure_log = (work / "log").string();
      std::ofstream(ran.failure_log) << "compiler exited with status 1\n";
      ran.result = CompileResult::of(outcome, "compiler exited with status 1");
      return ran;
    };
  };
  auto transient = compile_held(dest, settled_only(), failing(CompileOutcome::transient));
  CHECK(transient.outcome == CompileOutcome::transient);
  CHECK_FALSE(read_entry_files(entry)->failed());
  CHECK(test::fs::exists(work / "log"));  // not taken

  auto failed = compile_held(dest, settled_only(), failing(CompileOutcome::failed));
  CHECK(failed.outcome == CompileOutcome::failed);
  CHECK(read_entry_files(entry)->failed());
  CHECK(test::slurp(test::fs::path(entry) / "model.log") == "compiler exited with status 1\n");
  // Settled now: the next look answers without a run.
  auto again = compile_held(dest, settled_only(), failing(CompileOutcome::failed));
  CHECK(again.outcome == CompileOutcome::failed_cached);
}
