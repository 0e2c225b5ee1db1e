// The daemon's parts without a mount: the entry view, the inode table, the prepare queue
// and deadlines of compile-on-open, the input policy, stats, client locks and lock
// forwarding.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include <neffcache/cache/record.hpp>
#include <neffcache/store/directory.hpp>

#include "cache_policy.hpp"
#include "client_locks.hpp"
#include "compile_on_open.hpp"
#include "entry_view.hpp"
#include "inode_table.hpp"
#include "input_policy.hpp"
#include "lock_forwarding.hpp"
#include "stats.hpp"
#include "support.hpp"
#include "test_caller.hpp"

namespace fs = std::filesystem;
using namespace neffcachefs;
using neffcache::EntryFiles;
using neffcache::k_lnl_hlo_file;
using neffcache::EntryFile;
using neffcache::k_lnl_log_file;
using neffcache::k_lnl_metadata_file;
using neffcache::detail::UniqueFd;
using namespace std::chrono_literals;

namespace {

EntryFiles files_of(std::initializer_list<const char*> names) {
  EntryFiles f;
  for (const char* n : names) f.note(n);
  return f;
}

std::vector<std::string> names_of(const EntryFiles& f, EntryStage s, bool retry_failed = false) {
  std::vector<std::string> out;
  for (auto n : placeholder_names(f, s, retry_failed)) out.emplace_back(n);
  return out;
}

// The table of entry_view.hpp, written out apart from classify: no job, then a finished
// NEFF, then another compiler's, then a client's live lock, then a failure, then a
// product without the rest (partial), else pending.
EntryStage documented_stage(const EntryFiles& f, bool client_lock_live, bool ours) {
  if (!f.has_job()) return EntryStage::not_entry;
  if (f.done()) return EntryStage::done;
  if (!ours) return EntryStage::another_compiler;
  if (client_lock_live) return EntryStage::client_compiling;
  if (f.failed()) return EntryStage::failed;
  if (f.has(EntryFile::neff) || f.has(EntryFile::done) || (f.is_lnl() && f.has(EntryFile::compiler_log)))
    return EntryStage::partial;
  return EntryStage::pending;
}

// No placeholder ever stands beside a product file: a client that looks first would
// take it for a whole result (a marker beside a leftover NEFF).
void check_no_placeholder_beside_a_product(const EntryFiles& f, EntryStage stage) {
  if (f.has(EntryFile::neff) || f.has(EntryFile::done)) CHECK(names_of(f, stage, /*retry_failed=*/true).empty());
}

// Waits up to `limit` for `done`.
template <class F>
bool eventually(F done, std::chrono::milliseconds limit = 5000ms) {
  for (auto end = std::chrono::steady_clock::now() + limit; std::chrono::steady_clock::now() < end;) {
    if (done()) return true;
    std::this_thread::sleep_for(5ms);
  }
  return done();
}

}  // namespace

TEST_CASE("entry view: every set of a Neuron entry's files gets the stage of the documented precedence",
          "[fuse-unit]") {
  const char* names[] = {"model.hlo_module.pb", "model.neff", "model.done", "model.log", "model.hlo_module.pb.lock"};
  for (unsigned set = 0; set < 32; ++set)
    for (bool client : {false, true})
      for (bool ours : {false, true}) {
        EntryFiles f;
        for (unsigned b = 0; b < 5; ++b)
          if (set & (1u << b)) f.note(names[b]);
        const bool live = client && f.has_lock();  // (client_lock_held_at: no file, no lock)
        INFO("files " << set << " client " << client << " ours " << ours);
        CHECK(entry_stage(f, live, ours) == documented_stage(f, live, ours));
        check_no_placeholder_beside_a_product(f, entry_stage(f, live, ours));
      }
}

TEST_CASE("entry view: every set of an LNL entry's files gets the stage of the documented precedence",
          "[fuse-unit][lnl]") {
  const EntryFiles empty = EntryFiles::of_entry_path("0123456789abcdef0123456789abcdef");
  const std::vector<std::string> names = {std::string(k_lnl_hlo_file), std::string(k_lnl_metadata_file),
                                          empty.neff_name(), std::string(empty.done_name()),
                                          std::string(empty.failure_name()), std::string(k_lnl_log_file)};
  for (unsigned set = 0; set < 64; ++set)
    for (bool client : {false, true})
      for (bool ours : {false, true}) {
        EntryFiles f = empty;
        for (unsigned b = 0; b < names.size(); ++b)
          if (set & (1u << b)) f.note(names[b]);
        INFO("files " << set << " client " << client << " ours " << ours);
        CHECK(entry_stage(f, client, ours) == documented_stage(f, client, ours));
        check_no_placeholder_beside_a_product(f, entry_stage(f, client, ours));
      }
}

TEST_CASE("entry view: what each stage of an entry shows and what its open does", "[fuse-unit]") {
  SECTION("no HLO: nothing") {
    auto f = files_of({"model.neff"});
    CHECK(entry_stage(f, false, true) == EntryStage::not_entry);
    CHECK(names_of(f, entry_stage(f, false, true)).empty());
  }
  SECTION("pending: both placeholders, the open compiles") {
    auto f = files_of({"model.hlo_module.pb"});
    CHECK(entry_stage(f, false, true) == EntryStage::pending);
    CHECK(names_of(f, EntryStage::pending) == std::vector<std::string>{"model.neff", "model.done"});
    CHECK(placeholder_open(EntryStage::pending, false) == PlaceholderOpen::compile);
  }
  SECTION("a leftover product (a NEFF without model.done, model.done without a NEFF): partial, shown as on a disk") {
    for (auto f : {files_of({"model.hlo_module.pb", "model.neff"}), files_of({"model.hlo_module.pb", "model.done"})}) {
      CHECK(entry_stage(f, false, true) == EntryStage::partial);
      CHECK(names_of(f, EntryStage::partial, true).empty());
    }
  }
  SECTION("a client compiling it (its live lock): none") {
    auto f = files_of({"model.hlo_module.pb", "model.hlo_module.pb.lock"});
    CHECK(entry_stage(f, true, true) == EntryStage::client_compiling);
    CHECK(names_of(f, EntryStage::client_compiling).empty());
    CHECK_FALSE(shows_placeholders(EntryStage::client_compiling, true));
  }
  SECTION("another compiler's (its folder names a version ours does not report): none, whatever its files") {
    for (auto f : {files_of({"model.hlo_module.pb"}), files_of({"model.hlo_module.pb", "model.log"}),
                   files_of({"model.hlo_module.pb", "model.hlo_module.pb.lock"})}) {
      CHECK(entry_stage(f, false, false) == EntryStage::another_compiler);
      CHECK(names_of(f, EntryStage::another_compiler, true).empty());
    }
    CHECK(entry_stage(files_of({"model.hlo_module.pb", "model.neff", "model.done"}), false, false) == EntryStage::done);
    CHECK(compiles_here("/c/neuronxcc-2.21.0.0+fake/MODULE_1+2", "neuronxcc-2.21.0.0+fake"));
    CHECK_FALSE(compiles_here("/c/neuronxcc-2.21.0/MODULE_1+2", "neuronxcc-2.21.0.0+fake"));
    CHECK_FALSE(compiles_here("/c/neuronxcc-2.21.0/MODULE_1+2", ""));
    CHECK(compiles_here("/c/0123456789abcdef0123456789abcdef", ""));  // LNL: its key names its compiler
    CHECK(compiles_here("/c/neuronxcc-2.21.0/MODULE_1+2", std::nullopt));  // compiles off: a miss is refused
  }
  SECTION("done: the real files, no placeholders, even with a client lock") {
    auto f = files_of({"model.hlo_module.pb", "model.neff", "model.done"});
    CHECK(entry_stage(f, true, true) == EntryStage::done);
    CHECK(names_of(f, EntryStage::done).empty());
  }
  SECTION("failed: as on a disk, no placeholders (a status tool reads it as failed); with --retry-failed, "
          "placeholders whose open compiles; an open that finds it failed after its lookup fails") {
    auto f = files_of({"model.hlo_module.pb", "model.log"});
    CHECK(entry_stage(f, false, true) == EntryStage::failed);
    CHECK_FALSE(shows_placeholders(EntryStage::failed, false));
    CHECK(names_of(f, EntryStage::failed).empty());
    CHECK(shows_placeholders(EntryStage::failed, true));
    CHECK(names_of(f, EntryStage::failed, true) == std::vector<std::string>{"model.neff", "model.done"});
    CHECK(placeholder_open(EntryStage::failed, false) == PlaceholderOpen::fail_recorded);
    CHECK(placeholder_open(EntryStage::failed, true) == PlaceholderOpen::compile);
  }
  SECTION("a compile's result is shown while the files say it, and no longer once cleared") {
    using neffcache::CompileOutcome;
    auto failed = files_of({"model.hlo_module.pb", "model.log"});
    CHECK(shows_result(failed, CompileOutcome::failed));
    CHECK(shows_result(failed, CompileOutcome::failed_cached));
    CHECK_FALSE(shows_result(failed, CompileOutcome::success));
    // Retried (`neffcache retry` removes model.log): the failure is no answer any more.
    auto retried = files_of({"model.hlo_module.pb"});
    CHECK_FALSE(shows_result(retried, CompileOutcome::failed));
    CHECK_FALSE(shows_result(retried, CompileOutcome::success));
    auto done = files_of({"model.hlo_module.pb", "model.neff", "model.done"});
    CHECK(shows_result(done, CompileOutcome::success));
    CHECK(shows_result(done, CompileOutcome::already_done));
    CHECK_FALSE(shows_result(done, CompileOutcome::failed));
    CHECK_FALSE(shows_result(failed, CompileOutcome::transient));
  }
  SECTION("names") {
    CHECK(is_hlo_name(neffcache::k_hlo_module_file));
    CHECK(is_hlo_name(neffcache::k_hlo_legacy_file));
    CHECK_FALSE(is_hlo_name("model.neff"));
    CHECK(is_product_name("model.neff"));
    CHECK(is_product_name("model.done"));
    CHECK_FALSE(is_product_name("model.log"));
  }
}

TEST_CASE("entry view: read from a backing folder", "[fuse-unit]") {
  test::TempDir d;
  test::spit(d / "neuronxcc-2" / "e" / "model.hlo_module.pb", "x");
  test::spit(d / "plain" / "readme", "x");
  auto stage_of = [&](const std::string& dir, std::optional<std::string> compiler_dir = "neuronxcc-2") {
    UniqueFd fd(::open((d / dir).c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    REQUIRE(fd);
    return entry_stage_at(fd.get(), compiler_dir, /*writable=*/true);
  };
  CHECK(stage_of("neuronxcc-2/e") == EntryStage::pending);
  CHECK(stage_of("neuronxcc-2/e", "neuronxcc-3") == EntryStage::another_compiler);
  CHECK(stage_of("plain") == EntryStage::not_entry);
  SECTION("a placeholder's attributes are those its product will have, but its size") {
    const auto hlo = d / "neuronxcc-2" / "e" / "model.hlo_module.pb";
    test::fs::last_write_time(hlo, test::fs::file_time_type::clock::now() - std::chrono::hours(5));
    struct stat in {};
    REQUIRE(::stat(hlo.c_str(), &in) == 0);
    UniqueFd fd(::open((d / "neuronxcc-2/e").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    auto placeholder_at = [&](const char* name, mode_t umask) {
      auto look = look_at(fd.get(), "neuronxcc-2", /*writable=*/true);
      REQUIRE(look.has_value());
      return placeholder_attr(fd.get(), *look, name, /*retry_failed=*/false, umask);
    };
    for (const char* name : {"model.neff", "model.done"}) {
      auto st = placeholder_at(name, 022);
      REQUIRE(st.has_value());
      CHECK(st->st_mode == (S_IFREG | 0644));
      CHECK(st->st_size == 0);
      CHECK(st->st_uid == in.st_uid);
      CHECK(st->st_gid == in.st_gid);
      CHECK(st->st_mtim.tv_sec == in.st_mtim.tv_sec);
      CHECK(st->st_mtim.tv_nsec == in.st_mtim.tv_nsec);
    }
    // The daemon's umask: what the published NEFF loses.
    CHECK(placeholder_at("model.neff", 077)->st_mode == (S_IFREG | 0600));
    CHECK_FALSE(placeholder_at("model.log", 022));
    // Beside a leftover NEFF: none at all.
    test::spit(d / "neuronxcc-2" / "e" / "model.neff", "x");
    CHECK(stage_of("neuronxcc-2/e") == EntryStage::partial);
    CHECK_FALSE(placeholder_at("model.done", 022));
    test::fs::remove(d / "neuronxcc-2" / "e" / "model.neff");
  }
  SECTION("our own publish, interrupted after its NEFF went in place: unfinished where the daemon may write, its "
          "marker a placeholder; a leftover NEFF is partial") {
    const auto e = d / "neuronxcc-2" / "e";
    test::spit(e / "model.neff", "a NEFF we published");
    struct stat neff {};
    REQUIRE(::stat((e / "model.neff").c_str(), &neff) == 0);
    nlohmann::ordered_json record{{"xxh3", "0123456789abcdef"}};
    neffcache::detail::describe_neff(record, neff);
    test::spit(e / ".neffcache-meta.json", record.dump());
    UniqueFd fd(::open(e.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
    auto look = look_at(fd.get(), "neuronxcc-2", /*writable=*/true);
    REQUIRE(look.has_value());
    CHECK(look->stage == EntryStage::unfinished);
    CHECK(names_of(look->files, look->stage) == std::vector<std::string>{"model.done"});
    CHECK(placeholder_attr(fd.get(), *look, "model.done", false, 022).has_value());
    CHECK_FALSE(placeholder_attr(fd.get(), *look, "model.neff", false, 022).has_value());
    CHECK(placeholder_open(EntryStage::unfinished, false) == PlaceholderOpen::compile);
    // In a read-only layer (or a scratch mount) nothing is finished: shown as it is.
    CHECK(look_at(fd.get(), "neuronxcc-2", /*writable=*/false)->stage == EntryStage::partial);
    // Another file in its place (another mtime): a leftover.
    test::fs::last_write_time(e / "model.neff", test::fs::file_time_type::clock::now() - std::chrono::hours(1));
    CHECK(stage_of("neuronxcc-2/e") == EntryStage::partial);
    test::fs::remove(e / "model.neff");
    test::fs::remove(e / ".neffcache-meta.json");
  }
  test::spit(d / "neuronxcc-2" / "e" / "model.log", "error");
  CHECK(stage_of("neuronxcc-2/e") == EntryStage::failed);
  test::spit(d / "neuronxcc-2" / "e" / "model.neff", "x");
  test::spit(d / "neuronxcc-2" / "e" / "model.done", "x");
  CHECK(stage_of("neuronxcc-2/e") == EntryStage::done);
}

TEST_CASE("inode table: references, forget, placeholders, renames and reopening", "[fuse-unit]") {
  test::TempDir d;
  test::spit(d / "a" / "f", "x");
  test::spit(d / "a" / "g", "x");
  InodeTable t(d.path().string(), {}, 2);
  auto intern = [&](Inode& parent, const char* name) {
    int err = 0;
    PathRef dir = t.path_fd(parent, err);
    REQUIRE(dir);
    UniqueFd fd(::openat(dir->get(), name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    REQUIRE(fd);
    struct stat st {};
    REQUIRE(::fstat(fd.get(), &st) == 0);
    return t.intern(parent, name, std::move(fd), st);
  };
  Inode* a = intern(t.root(), "a");
  CHECK(intern(t.root(), "a") == a);  // one inode per backing file
  CHECK(a->nlookup == 2);
  Inode* f = intern(*a, "f");
  CHECK(t.census().inodes == 2);
  CHECK(t.name_of(*f) == "f");
  CHECK(t.path_of(*f) == (d / "a" / "f").string());

  // A placeholder is one inode per name and holds its folder.
  Inode* p = t.intern_placeholder(*a, "model.neff");
  CHECK(t.intern_placeholder(*a, "model.neff") == p);
  CHECK(t.census().placeholders == 1);
  int err = 0;
  CHECK_FALSE(t.path_fd(*p, err));
  CHECK(err == ENOENT);

  // Renamed through the mount: known under the new name.
  int afd = ::open((d / "a").c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  fs::rename(d / "a" / "f", d / "a" / "h");
  t.moved(*a, afd, "h");
  ::close(afd);
  CHECK(t.name_of(*f) == "h");

  // The kernel forgets the folder: it stays while its file and placeholder use it.
  t.forget(t.id_of(a), 2);
  CHECK(t.census().inodes == 2);
  t.forget(reinterpret_cast<fuse_ino_t>(p), 2);
  CHECK(t.census().placeholders == 0);
  CHECK(t.census().inodes == 2);
  t.forget(reinterpret_cast<fuse_ino_t>(f), 1);  // the last reference: both go
  CHECK(t.census().inodes == 0);
  CHECK(t.census().open == 0);
}

TEST_CASE("inode table: descriptors are let go beyond the limit and reopened; a replaced file is stale", "[fuse-unit]") {
  test::TempDir d;
  test::spit(d / "x", "x");
  test::spit(d / "y", "x");
  test::spit(d / "z", "x");
  InodeTable t(d.path().string(), {}, 2);
  std::vector<Inode*> in;
  for (const char* n : {"x", "y", "z"}) {
    UniqueFd fd(::openat(t.root_fd()->get(), n, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    struct stat st {};
    REQUIRE(::fstat(fd.get(), &st) == 0);
    in.push_back(t.intern(t.root(), n, std::move(fd), st));
  }
  CHECK(t.census().open == 2);  // x was let go
  int err = 0;
  PathRef x = t.path_fd(*in[0], err);
  REQUIRE(x);  // reopened by its name
  CHECK(path_of_fd(x->get()) == (d / "x").string());
  CHECK(t.census().open == 2);
  // y is let go by that reopen; replaced by another file, it is stale.
  test::spit(d / "y2", "other");  // made while y exists: another inode number
  fs::rename(d / "y2", d / "y");
  err = 0;
  CHECK_FALSE(t.path_fd(*in[1], err));
  CHECK(err == ESTALE);
}

TEST_CASE("prepare queue: order, the waiters of one entry, stop", "[fuse-unit]") {
  PrepareQueue q;
  auto w1 = std::make_shared<Waiter>(), w2 = std::make_shared<Waiter>(), w3 = std::make_shared<Waiter>();
  auto w4 = std::make_shared<Waiter>();
  CHECK(q.push({"/c/A", neffcache::Priority::waiting, w1}));
  CHECK(q.push({"/c/B", neffcache::Priority::waiting, w2}));
  CHECK(q.push({"/c/A", neffcache::Priority::background, nullptr}));
  CHECK(q.push({"/c/A", neffcache::Priority::waiting, w3}));
  auto first = q.pop();
  REQUIRE(first);
  CHECK(first->entry_dir == "/c/A");
  CHECK(first->waiter == w1);
  // The answer for /c/A goes to w3 as well, not to w4, queued after the mark (an open
  // that may have come after the answer was acted on); the background item and B stay.
  const uint64_t mark = q.pushed();
  CHECK(mark == 4);
  CHECK(q.push({"/c/A", neffcache::Priority::waiting, w4}));
  auto taken = q.take_waiters("/c/A", mark);
  REQUIRE(taken.size() == 1);
  CHECK(taken[0] == w3);
  bool stopped = false;
  auto left = q.stop(stopped);
  CHECK(stopped);
  REQUIRE(left.size() == 3);
  CHECK(left[0].waiter == w2);
  CHECK_FALSE(left[1].waiter);
  CHECK(left[2].waiter == w4);
  CHECK_FALSE(q.pop());
  CHECK_FALSE(q.push({"/c/C", neffcache::Priority::waiting, nullptr}));
  q.stop(stopped);
  CHECK_FALSE(stopped);
}

TEST_CASE("compile-on-open: a result answers the waiters queued for its entry while the folder shows it", "[fuse-unit]") {
  // Before, a failure answered every waiter still queued for its entry, even one whose
  // caller had cleared it (`neffcache retry` removes model.log) and opened again after
  // the answer: that open got the old failure and no compile (a CI flake under ASan).
  using neffcache::CompileOutcome;
  using neffcache::CompileResult;
  test::TempDir d;
  const fs::path e = d / "neuronxcc-2.21.0" / "MODULE_c+0";
  test::spit(e / "model.hlo_module.pb", "x");
  test::spit(e / "model.log", "injected compile failure");
  const CompileResult failed = CompileResult::of(CompileOutcome::failed, "compiler exited with status 1");
  PrepareQueue q;
  auto w1 = std::make_shared<Waiter>(), w2 = std::make_shared<Waiter>(), other = std::make_shared<Waiter>();
  CHECK(q.push({e.string(), neffcache::Priority::waiting, w1}));
  CHECK(q.push({(d / "neuronxcc-2.21.0" / "MODULE_d+0").string(), neffcache::Priority::waiting, other}));
  // Queued during the compile, and the failure still recorded: answered with it.
  CHECK(waiters_answered_by(q, e.string(), CompileResult::of(CompileOutcome::transient)).empty());
  auto taken = waiters_answered_by(q, e.string(), failed);
  REQUIRE(taken.size() == 1);
  CHECK(taken[0] == w1);
  // Retried, then opened again: the failure is no answer for that open; it is prepared
  // and compiled as any other.
  fs::remove(e / "model.log");
  CHECK(q.push({e.string(), neffcache::Priority::waiting, w2}));
  CHECK(waiters_answered_by(q, e.string(), failed).empty());
  // Published meanwhile: a success answers it.
  test::spit(e / "model.neff", "neff");
  test::spit(e / "model.done", "");
  CHECK(waiters_answered_by(q, e.string(), failed).empty());
  taken = waiters_answered_by(q, e.string(), CompileResult::of(CompileOutcome::success));
  REQUIRE(taken.size() == 1);
  CHECK(taken[0] == w2);
  auto left = q.pop();
  REQUIRE(left);
  CHECK(left->waiter == other);
}

TEST_CASE("deadlines expire earliest first and skip waiters answered meanwhile", "[fuse-unit]") {
  Deadlines d;
  std::mutex mu;
  std::vector<std::string> expired;
  d.start([&](const std::shared_ptr<Waiter>& w) {
    std::lock_guard lk(mu);
    expired.push_back(w->name);
  });
  auto make = [](const char* name) {
    auto w = std::make_shared<Waiter>();
    w->name = name;
    return w;
  };
  auto now = Deadlines::Clock::now();
  auto late = make("late"), early = make("early"), middle = make("middle"), gone = make("gone");
  d.add(now + 150ms, late);
  d.add(now + 50ms, early);
  d.add(now + 20ms, gone);
  d.add(now + 100ms, middle);
  gone.reset();  // answered and released before its deadline
  CHECK(eventually([&] {
    std::lock_guard lk(mu);
    return expired.size() >= 3;
  }));
  d.stop();
  std::lock_guard lk(mu);
  CHECK(expired == std::vector<std::string>{"early", "middle", "late"});
  CHECK(d.pending() == 0);
}

TEST_CASE("compile-on-open: an answer known at submit runs on the prepare thread without a deadlock", "[fuse-unit]") {
  // Scheduler::submit runs the callback on the calling thread for a settled entry; the
  // callback takes the prepare queue's lock (answer_queued). Before, only the order of
  // two statements kept that from deadlocking.
  test::TempDir d;
  const fs::path done = d / "neuronxcc-2.21.0" / "MODULE_done+0", failed = d / "neuronxcc-2.21.0" / "MODULE_failed+0";
  test::spit(done / "model.hlo_module.pb", "x");
  test::spit(done / "model.neff", "x");
  test::spit(done / "model.done", "x");
  test::spit(failed / "model.hlo_module.pb", "x");
  test::spit(failed / "model.log", "error");
  Options opts;
  opts.backing = d.path().string();
  opts.store = neffcache::store::DirectoryStore::open(opts.backing);
  opts.scheduler.jobs = 1;
  Stats stats;
  CompileOnOpen c(opts, stats);
  c.start();
  for (int i = 0; i < 3; ++i) {
    c.request(done.string(), neffcache::Priority::background, nullptr);
    c.request(failed.string(), neffcache::Priority::background, nullptr);
  }
  CHECK(eventually([&] { return c.progress().total == 6; }));
  auto p = c.progress();
  CHECK(p.done == 3);
  CHECK(p.failed == 3);
  CHECK(p.compiles_started == 0);
  c.shutdown();
}

TEST_CASE("input policy: which finished writes start a compile or an upload", "[fuse-unit]") {
  const std::string entry = "/c/neuronxcc-2.21.0/MODULE_1+0/";
  SECTION("eager, local") {
    InputPolicy p(true, false);
    CHECK(p.after_close(entry + "model.hlo_module.pb") == InputAction::compile);
    CHECK(p.after_close(entry + "compile_flags.json") == InputAction::none);
    CHECK(p.after_close("/c/other/model.hlo_module.pb") == InputAction::none);  // not an entry folder
    CHECK(p.after_close("") == InputAction::none);
    CHECK(p.after_rename("model.hlo_module.pb") == InputAction::compile);
    CHECK(p.after_rename("notes.txt") == InputAction::none);
    CHECK(p.flush_may_cut("model.hlo_module.pb"));
    CHECK_FALSE(p.flush_may_cut("model.neff"));
  }
  SECTION("not eager, S3: uploads only") {
    InputPolicy p(false, true);
    CHECK(p.after_close(entry + "model.hlo_module.pb") == InputAction::upload);
    CHECK(p.after_close(entry + "compile_flags.json") == InputAction::upload);
    CHECK(p.after_rename("model.hlo_module.pb") == InputAction::upload);
    CHECK_FALSE(p.flush_may_cut("model.hlo_module.pb"));
  }
  SECTION("neither: nothing") {
    InputPolicy p(false, false);
    CHECK(p.after_rename("model.hlo_module.pb") == InputAction::none);
    CHECK_FALSE(p.release_may_act(7, true, false));
  }
  SECTION("a write cut short starts nothing, and its mark is forgotten at release") {
    InputPolicy p(true, false);
    CHECK_FALSE(p.release_may_act(7, false, false));  // read only
    CHECK_FALSE(p.release_may_act(7, true, true));    // a placeholder
    p.mark_cut(7);
    CHECK_FALSE(p.release_may_act(7, true, false));
    CHECK(p.release_may_act(7, true, false));  // the mark went with the first release
  }
  SECTION("a living process is not being killed") { CHECK_FALSE(InputPolicy::killed_while_exiting(::gettid())); }
}

TEST_CASE("stats: counters and EIO sites in stats.json, snapshots by handle", "[fuse-unit]") {
  Stats s;
  s.hits += 3;
  s.eio(EioSite::failed_cached, "unit test");
  s.eio(EioSite::failed_cached, "unit test");
  CHECK(s.eio_count(EioSite::failed_cached) == 2);
  Stats::Context ctx;
  ctx.jobs = 4;
  ctx.backing = "/b";
  auto j = nlohmann::ordered_json::parse(s.json(ctx));
  CHECK(j["hits"] == 3);
  CHECK(j["eio"]["03"] == 2);
  CHECK(j["eio"]["01"] == 0);
  CHECK(j["jobs"] == 4);
  CHECK(j["backing"] == "/b");
  CHECK_FALSE(j.contains("s3"));
  CHECK(j.begin().key() == "hits");  // the order tools see
  auto fh = s.open_snapshot("0123456789");
  CHECK(s.read_snapshot(fh, 4, 3) == "3456");
  CHECK(s.read_snapshot(fh, 100, 8) == "89");
  CHECK(s.read_snapshot(fh, 4, 50).empty());
  s.release_snapshot(fh);
  CHECK(s.open_snapshot("x") != fh);
}

TEST_CASE("client locks: held while the creator lives, removed when it exits", "[fuse-unit]") {
  test::TempDir d;
  const std::string lock = "model.hlo_module.pb.lock";
  test::spit(d / lock, "");
  test::spit(d / "other", "");
  UniqueFd dir(::open(d.path().c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  int go[2];
  REQUIRE(::pipe(go) == 0);
  pid_t child = ::fork();
  if (child == 0) {
    ::close(go[1]);  // so that the parent's close is an end of file here
    char c;
    (void)!::read(go[0], &c, 1);
    ::_exit(0);
  }
  ::close(go[0]);
  ClientLocks locks;
  locks.start();
  locks.track(child, dir.get(), "other");  // not a lock name
  CHECK(locks.held() == 0);
  locks.track(child, dir.get(), lock.c_str());
  CHECK(locks.held() == 1);
  // Our OFD lock makes the file live for others.
  UniqueFd probe(::open((d / lock).c_str(), O_RDWR | O_CLOEXEC));
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  CHECK(::fcntl(probe.get(), F_OFD_SETLK, &fl) != 0);
  std::this_thread::sleep_for(50ms);
  CHECK(fs::exists(d / lock));  // the creator lives
  ::close(go[1]);
  ::waitpid(child, nullptr, 0);
  CHECK(eventually([&] { return !fs::exists(d / lock); }));
  CHECK(locks.held() == 0);
  // Removed through the mount: forgotten, and the file stays.
  test::spit(d / lock, "");
  locks.track(::getpid(), dir.get(), lock.c_str());
  CHECK(locks.held() == 1);
  locks.forget(dir.get(), lock.c_str());
  CHECK(locks.held() == 0);
  locks.stop();
  CHECK(fs::exists(d / lock));
}

TEST_CASE("lock forwarding: OFD locks and flocks that need no wait", "[fuse-unit]") {
  test::TempDir d;
  test::spit(d / "f", "x");
  UniqueFd a(::open((d / "f").c_str(), O_RDWR | O_CLOEXEC)), b(::open((d / "f").c_str(), O_RDWR | O_CLOEXEC));
  LockForwarding locks;
  const without_mount::TestCaller caller;
  struct flock l {};
  l.l_type = F_WRLCK;
  l.l_whence = SEEK_SET;
  l.l_pid = 1234;  // ignored: OFD locks need 0
  CHECK(locks.setlk(caller, a.get(), l, false).ok());
  auto conflict = locks.setlk(caller, b.get(), l, false);
  CHECK_FALSE(conflict.ok());
  CHECK_FALSE(conflict.deferred());
  CHECK((conflict.error() == EAGAIN || conflict.error() == EACCES));
  auto seen = locks.getlk(b.get(), l);
  REQUIRE(seen.ok());
  CHECK(seen.value().l_type == F_WRLCK);
  CHECK(locks.flock(caller, a.get(), LOCK_EX).ok());
  auto busy = locks.flock(caller, b.get(), LOCK_EX | LOCK_NB);
  CHECK(busy.error() == EWOULDBLOCK);
  CHECK(locks.waiting() == 0);
  CHECK(caller.kept() == nullptr);  // nothing waited
}

TEST_CASE("lock forwarding: a lock that waits is answered once its holder lets go, or when its caller gives up",
          "[fuse-unit]") {
  test::TempDir d;
  test::spit(d / "f", "x");
  UniqueFd a(::open((d / "f").c_str(), O_RDWR | O_CLOEXEC)), b(::open((d / "f").c_str(), O_RDWR | O_CLOEXEC));
  LockForwarding locks;
  const without_mount::TestCaller caller;
  CHECK(locks.flock(caller, a.get(), LOCK_EX).ok());
  auto waits = locks.flock(caller, b.get(), LOCK_EX);
  CHECK(waits.deferred());
  auto answered = caller.kept();
  REQUIRE(answered);
  CHECK_FALSE(answered->wait(50ms));
  CHECK(locks.flock(caller, a.get(), LOCK_UN).ok());
  REQUIRE(answered->wait());
  CHECK(answered->err == 0);
  // Held by b now: a's wait ends when its caller gives up.
  CHECK(locks.flock(caller, a.get(), LOCK_SH).deferred());
  answered = caller.kept();
  CHECK_FALSE(answered->wait(50ms));
  answered->interrupt();
  REQUIRE(answered->wait());
  CHECK(answered->err == EINTR);
  CHECK(eventually([&] { return locks.waiting() == 0; }));
  CHECK(answered->answers == 1);
}

TEST_CASE("the cache policy: a done entry's files kept a day and their pages kept for readers; placeholders and "
          "the counters never kept, read through direct I/O",
          "[fuse]") {
  CHECK(cache_timeout(NodeKind::finished) == 86400);
  CHECK(cache_timeout(NodeKind::plain) == 1);
  CHECK(cache_timeout(NodeKind::placeholder) == 0);
  CHECK(cache_timeout(NodeKind::special) == 0);
  auto opened = [](NodeKind kind, bool reading, bool passes_through = false) {
    fuse_file_info fi{};
    set_open_caching(fi, kind, reading, passes_through);
    return std::tuple(unsigned{fi.direct_io}, unsigned{fi.keep_cache}, unsigned{fi.noflush});
  };
  CHECK(opened(NodeKind::finished, true) == std::tuple(0u, 1u, 1u));
  // A reader that passes through keeps no pages of its own (the kernel would fail its open).
  CHECK(opened(NodeKind::finished, true, true) == std::tuple(0u, 0u, 1u));
  CHECK(opened(NodeKind::finished, false) == std::tuple(0u, 0u, 0u));
  CHECK(opened(NodeKind::plain, true) == std::tuple(0u, 0u, 0u));
  CHECK(opened(NodeKind::placeholder, true) == std::tuple(1u, 0u, 0u));
  CHECK(opened(NodeKind::special, true) == std::tuple(1u, 0u, 0u));
  fuse_file_info dir{};
  set_listing_caching(dir, false);
  CHECK((dir.cache_readdir && dir.keep_cache));
  set_listing_caching(dir, true);
  CHECK_FALSE((dir.cache_readdir || dir.keep_cache));
}
