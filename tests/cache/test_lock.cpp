// Entry locks across processes: one holder at a time, dead holders taken over, live
// ones never robbed, existence-only locks of unmodified clients respected.
// GCC 12 warns that a disengaged std::optional<ProcessIdentity> (LockOptions::identity)
// may be destroyed uninitialized: its false positive of GCC bug 80635.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <fcntl.h>
#include <sys/stat.h>

#include <thread>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/cache/lock.hpp>

#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;

namespace {

const std::string k_helper = test::path::lock_helper;

// A record as another neffcache process would write it, with its heartbeat `age` ago.
void write_foreign_record(const test::fs::path& p, detail::ProcessIdentity who, std::chrono::seconds age) {
  test::spit(p, detail::lock_record(LockOwner{std::move(who), "feedfacefeedface"}));
  struct timespec ts[2];
  ts[0].tv_sec = ts[1].tv_sec = ::time(nullptr) - age.count();
  ts[0].tv_nsec = ts[1].tv_nsec = 0;
  REQUIRE(::utimensat(AT_FDCWD, p.c_str(), ts, 0) == 0);
}

}  // namespace

TEST_CASE("a lock holds an owner record and is gone after release", "[lock]") {
  test::TempDir dir;
  std::string path = (dir / "model.hlo_module.pb.lock").string();
  {
    auto lock = EntryLock::try_acquire(path);
    REQUIRE(lock.has_value());
    CHECK_FALSE(lock->previous().has_value());
    auto owner = detail::parse_lock_record(test::slurp(path));
    REQUIRE(owner.has_value());
    CHECK(owner->process.pid == ::getpid());
    CHECK(owner->process.boot_id == detail::current_process().boot_id);

    // A second acquisition, even from this process, is refused while it is held.
    auto again = EntryLock::try_acquire(path);
    REQUIRE_FALSE(again.has_value());
    CHECK(again.error().code == Errc::busy);
    CHECK(again.error().message.find("held by a running process") != std::string::npos);
    auto info = inspect_lock(path);
    REQUIRE(info.has_value());
    CHECK(info->state == LockState::live);
    CHECK(info->kernel_locked);
    // Nothing but the lock file is left in the folder: the private name is gone.
    int files = 0;
    for ([[maybe_unused]] const auto& e : test::fs::directory_iterator(dir.path())) ++files;
    CHECK(files == 1);
  }
  CHECK_FALSE(test::fs::exists(path));
  CHECK(inspect_lock(path)->state == LockState::absent);
}

TEST_CASE("many processes contending: exactly one holder at any time", "[lock][processes]") {
  test::TempDir dir;
  std::string path = (dir / "model.hlo_module.pb.lock").string();
  std::string marker = (dir / "inside").string();
  std::vector<std::unique_ptr<test::Child>> kids;
  for (int i = 0; i < 6; ++i)
    kids.push_back(std::make_unique<test::Child>(std::vector<std::string>{k_helper, "contend", path, "40", marker}));
  for (auto& k : kids) CHECK(k->wait() == 0);  // 3 would mean two holders at once
  CHECK_FALSE(test::fs::exists(path));
}

TEST_CASE("a SIGKILLed holder's lock is taken over at once", "[lock][processes]") {
  test::TempDir dir;
  std::string path = (dir / "model.hlo_module.pb.lock").string();
  test::Child holder({k_helper, "hold", path, "600000"});
  REQUIRE(holder.line() == "acquired");
  CHECK(EntryLock::try_acquire(path).error().code == Errc::busy);
  holder.kill(SIGKILL);
  CHECK(holder.wait() == -SIGKILL);
  // The file and its record remain, but the kernel lock died with the holder and the
  // record names a process that no longer exists: provably dead.
  REQUIRE(test::fs::exists(path));
  auto start = std::chrono::steady_clock::now();
  auto lock = EntryLock::acquire(path, start + 2s);
  REQUIRE(lock.has_value());
  CHECK(std::chrono::steady_clock::now() - start < 1s);
  REQUIRE(lock->previous().has_value());
  CHECK(lock->previous()->reason.find("is gone") != std::string::npos);
  CHECK(detail::parse_lock_record(test::slurp(path))->process.pid == ::getpid());
}

TEST_CASE("a live, heartbeating holder is never robbed", "[lock][processes]") {
  test::TempDir dir;
  std::string path = (dir / "model.hlo_module.pb.lock").string();
  LockOptions opts;
  // A short bound, so that a missed heartbeat would show: the holder beats every 250 ms.
  // (Shorter bounds turn a loaded machine's scheduling delays into false robberies.)
  opts.stale_after = 1000ms;
  test::Child holder({k_helper, "hold", path, "2500", "1000"});
  REQUIRE(holder.line() == "acquired");
  int refused = 0;
  for (auto end = std::chrono::steady_clock::now() + 2s; std::chrono::steady_clock::now() < end;) {
    auto r = EntryLock::try_acquire(path, opts);
    REQUIRE_FALSE(r.has_value());
    CHECK(r.error().code == Errc::busy);
    ++refused;
    std::this_thread::sleep_for(10ms);
  }
  CHECK(refused > 50);
  CHECK(holder.wait() == 0);  // its heartbeats never found the lock lost
  auto after = EntryLock::try_acquire(path, opts);
  REQUIRE(after.has_value());
  CHECK_FALSE(after->previous().has_value());  // released normally, not taken over
}

TEST_CASE("an owner on another host is judged by its heartbeat", "[lock]") {
  test::TempDir dir;
  auto path = dir / "model.hlo_module.pb.lock";
  auto other = detail::current_process();
  other.host = "trn1-node-7";
  other.boot_id = "00000000-0000-0000-0000-000000000007";
  write_foreign_record(path, other, 0s);
  test::FakeClock clock;
  LockOptions opts;
  opts.clock = &clock;
  opts.stale_after = 20s;

  clock.set(std::chrono::system_clock::now() + 5s);
  auto busy = EntryLock::try_acquire(path.string(), opts);
  REQUIRE_FALSE(busy.has_value());
  CHECK(busy.error().message.find("trn1-node-7, last heartbeat") != std::string::npos);
  CHECK(inspect_lock(path.string(), opts)->state == LockState::live);

  clock.advance(20s);
  CHECK(inspect_lock(path.string(), opts)->state == LockState::stale);
  auto lock = EntryLock::try_acquire(path.string(), opts);
  REQUIRE(lock.has_value());
  REQUIRE(lock->previous().has_value());
  CHECK(lock->previous()->owner->process.host == "trn1-node-7");
}

TEST_CASE("a record of a finished process on this host is stale even when fresh", "[lock]") {
  test::TempDir dir;
  auto path = dir / "model.hlo_module.pb.lock";
  test::Child gone({"true"});
  auto who = detail::current_process();
  who.pid = gone.pid();
  who.start_time = detail::process_start_time(gone.pid()).value_or(1);
  REQUIRE(gone.wait() == 0);
  write_foreign_record(path, who, 0s);
  auto lock = EntryLock::try_acquire(path.string());
  REQUIRE(lock.has_value());
  CHECK(lock->previous()->reason.find("is gone") != std::string::npos);
}

TEST_CASE("existence-only locks: a fresh one is respected, an old one taken over", "[lock]") {
  test::TempDir dir;
  auto path = dir / "model.hlo.pb.lock";
  test::touch(path);  // what an unmodified Neuron client leaves while it compiles
  test::FakeClock clock;
  LockOptions opts;
  opts.clock = &clock;
  opts.anonymous_stale_after = 2h;

  auto busy = EntryLock::try_acquire(path.string(), opts);
  REQUIRE_FALSE(busy.has_value());
  CHECK(busy.error().message.find("without owner record") != std::string::npos);
  clock.advance(2h - 1min);
  CHECK(inspect_lock(path.string(), opts)->state == LockState::live);
  clock.advance(2min);
  CHECK(inspect_lock(path.string(), opts)->state == LockState::stale);
  auto lock = EntryLock::try_acquire(path.string(), opts);
  REQUIRE(lock.has_value());
  CHECK_FALSE(lock->previous()->owner.has_value());
}

TEST_CASE("acquire waits, but only until its deadline", "[lock]") {
  test::TempDir dir;
  auto path = dir / "x.lock";
  test::touch(path);
  LockOptions opts;
  opts.poll_interval = 20ms;
  auto start = std::chrono::steady_clock::now();
  auto r = EntryLock::acquire(path.string(), start + 200ms, opts);
  REQUIRE_FALSE(r.has_value());
  CHECK(r.error().code == Errc::timed_out);
  auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= 200ms);
  CHECK(waited < 5s);
}

TEST_CASE("heartbeat refreshes the mtime and notices a lost lock", "[lock]") {
  test::TempDir dir;
  auto path = dir / "model.hlo_module.pb.lock";
  auto lock = EntryLock::try_acquire(path.string());
  REQUIRE(lock.has_value());
  struct timespec old[2] = {{1000, 0}, {1000, 0}};
  REQUIRE(::utimensat(AT_FDCWD, path.c_str(), old, 0) == 0);
  REQUIRE(lock->heartbeat().has_value());
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK(st.st_mtim.tv_sec > ::time(nullptr) - 60);

  // Someone judged us dead and replaced the file: we must notice, and never remove
  // what is now theirs.
  test::fs::remove(path);
  test::spit(path, "theirs");
  auto hb = lock->heartbeat();
  REQUIRE_FALSE(hb.has_value());
  CHECK(hb.error().message.find("was lost") != std::string::npos);
  lock->release();
  CHECK(test::slurp(path) == "theirs");
}

TEST_CASE("one judge of a held lock: a live owner's, a client's flock; not a dead owner's, nor a file gone",
          "[lock]") {
  test::TempDir dir;
  const auto entry = dir / "neuronxcc-2.21.0" / "MODULE_1+abc";
  test::fs::create_directories(entry);
  test::spit(entry / "model.hlo_module.pb", "hlo");
  const EntryFiles files = *read_entry_files(entry.string());
  const std::string name = files.lock_name();
  detail::UniqueFd fd(::open(entry.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  CHECK_FALSE(lock_held_at(fd.get(), name, files));  // no lock file
  {
    auto lock = EntryLock::try_acquire_entry(entry.string(), files);
    REQUIRE(lock.has_value());
    CHECK(lock_held_at(fd.get(), name, files));
    CHECK(entry_locked(entry.string(), files));
  }
  // A record of a process that is gone: stale, so not held, by either question.
  test::Child gone({"true"});
  auto who = detail::current_process();
  who.pid = gone.pid();
  who.start_time = detail::process_start_time(gone.pid()).value_or(1);
  REQUIRE(gone.wait() == 0);
  write_foreign_record(entry / name, who, 0s);
  CHECK_FALSE(lock_held_at(fd.get(), name, files));
  CHECK_FALSE(entry_locked(entry.string(), files));

  // An LNL entry: its flock beside the folder, held by anyone.
  const auto key = dir / "0123456789abcdef0123456789abcdef";
  test::fs::create_directories(key);
  const EntryFiles lnl = *read_entry_files(key.string());
  detail::UniqueFd kfd(::open(key.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  CHECK_FALSE(lock_held_at(kfd.get(), lnl.lock_name(), lnl));
  auto flock = EntryLock::try_acquire_flock(entry_lock_path(key.string(), lnl));
  REQUIRE(flock.has_value());
  CHECK(lock_held_at(kfd.get(), lnl.lock_name(), lnl));
  CHECK(entry_locked(key.string(), lnl));
}
