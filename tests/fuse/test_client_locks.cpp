// Lock files unmodified clients create through the mount, and locks forwarded to the
// backing file.
#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

TEST_CASE("a lock file created through the mount is owned by its creator, stale at once when it dies", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_tuple.hlo.pb", "lock+0");
  auto lock_in_mount = m.mnt() / e / "model.hlo_module.pb.lock";
  auto lock_in_backing = m.backing() / e / "model.hlo_module.pb.lock";
  // What an unmodified Neuron client does: create the lock in its own process, compile.
  test::Child client({"sh", "-c", fmt::format("exec 3>'{}'; echo created; exec sleep 60", lock_in_mount.string())});
  REQUIRE(client.line() == "created");
  auto info = inspect_lock(lock_in_backing.string());
  REQUIRE(info.has_value());
  CHECK(info->state == LockState::live);
  CHECK(info->kernel_locked);  // held for the client: tools and other daemons keep off
  CompileSettings tool;
  tool.compiler = CompilerTemplate::parse(k_fake + " {hlo} --output {neff}").value();
  CHECK(compile_entry((m.backing() / e).string(), tool).outcome == CompileOutcome::busy);

  client.kill(SIGKILL);
  client.wait();
  for (int i = 0; i < 100 && fs::exists(lock_in_backing); ++i) std::this_thread::sleep_for(10ms);
  CHECK_FALSE(fs::exists(lock_in_backing));  // gone within a second
  CHECK(read_all(m.mnt() / e / "model.neff").first == 0);
}

TEST_CASE("an entry's lock whose owner is gone is removed when the entry is looked up; a live one stays", "[fuse]") {
  test::TempDir shared;
  std::string dead, live;
  {
    Mount m({}, {}, shared.path());
    dead = m.entry("gopjrt_tuple.hlo.pb", "deadlock+0");
    live = m.entry("gopjrt_x_squared.hlo.pb", "livelock+0");
    REQUIRE(read_all(m.mnt() / dead / "model.neff").first == 0);
    REQUIRE(read_all(m.mnt() / live / "model.neff").first == 0);
  }
  // What a publisher killed between model.done and its unlock leaves: a lock whose owner,
  // a process of this machine, is gone.
  test::Child gone({"true"});
  auto owner = detail::current_process();
  owner.pid = gone.pid();
  gone.wait();
  test::spit(shared / dead / "model.hlo_module.pb.lock", detail::lock_record(LockOwner{owner, "0123456789abcdef"}));
  auto held = EntryLock::try_acquire((shared / live / "model.hlo_module.pb.lock").string());
  REQUIRE(held.has_value());

  Mount m({}, {}, shared.path());
  struct stat st {};
  REQUIRE(::stat((m.mnt() / dead).c_str(), &st) == 0);
  REQUIRE(::stat((m.mnt() / live).c_str(), &st) == 0);
  CHECK_FALSE(fs::exists(shared / dead / "model.hlo_module.pb.lock"));
  CHECK(fs::exists(shared / live / "model.hlo_module.pb.lock"));
  CHECK(read_all(m.mnt() / dead / "model.neff").first == 0);
  CHECK(m.compiles() == 0);
}

TEST_CASE("a client that removes its own lock file leaves nothing tracked", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_tuple.hlo.pb", "lock2+0");
  auto lock = m.mnt() / e / "model.hlo_module.pb.lock";
  test::Child client({"sh", "-c", fmt::format("exec 3>'{}'; rm '{}'; echo done; exec sleep 60", lock.string(), lock.string())});
  REQUIRE(client.line() == "done");
  CHECK_FALSE(fs::exists(m.backing() / e / "model.hlo_module.pb.lock"));
  // A new lock by someone else at the same name is not touched when the first client dies.
  auto held = EntryLock::try_acquire((m.backing() / e / "model.hlo_module.pb.lock").string());
  REQUIRE(held.has_value());
  client.kill(SIGKILL);
  client.wait();
  std::this_thread::sleep_for(200ms);
  CHECK(fs::exists(m.backing() / e / "model.hlo_module.pb.lock"));
}

TEST_CASE("locks through the mount and on the backing file see each other", "[fuse]") {
  Mount m;
  test::spit(m.backing() / "shared.dat", "data");
  auto through = m.mnt() / "shared.dat";
  auto direct = m.backing() / "shared.dat";

  // A POSIX lock taken by a client through the mount blocks a tool on the backing file.
  int client = ::open(through.c_str(), O_RDWR);
  REQUIRE(client >= 0);
  struct flock wr {};
  wr.l_type = F_WRLCK;
  wr.l_whence = SEEK_SET;
  REQUIRE(::fcntl(client, F_SETLK, &wr) == 0);
  int tool = ::open(direct.c_str(), O_RDWR);
  REQUIRE(tool >= 0);
  struct flock probe = wr;
  probe.l_pid = 0;
  REQUIRE(::fcntl(tool, F_OFD_GETLK, &probe) == 0);
  CHECK(probe.l_type == F_WRLCK);  // the tool sees the client's lock
  struct flock ofd = wr;
  ofd.l_pid = 0;
  CHECK(::fcntl(tool, F_OFD_SETLK, &ofd) != 0);
  ::close(client);  // closing releases it
  CHECK(::fcntl(tool, F_OFD_SETLK, &ofd) == 0);
  // ...and the tool's lock now blocks a client.
  client = ::open(through.c_str(), O_RDWR);
  CHECK(::fcntl(client, F_SETLK, &wr) != 0);
  CHECK((errno == EAGAIN || errno == EACCES));
  ::close(client);
  ::close(tool);

  // flock, both ways.
  tool = ::open(direct.c_str(), O_RDONLY);
  REQUIRE(::flock(tool, LOCK_EX | LOCK_NB) == 0);
  client = ::open(through.c_str(), O_RDONLY);
  CHECK(::flock(client, LOCK_EX | LOCK_NB) != 0);
  CHECK(errno == EWOULDBLOCK);
  // A blocking flock through the mount waits (on no daemon worker) until the tool lets go.
  test::Child waiter({"flock", through.string(), "-c", "echo got"});
  std::this_thread::sleep_for(200ms);
  ::flock(tool, LOCK_UN);
  CHECK(waiter.line() == "got");
  CHECK(waiter.wait() == 0);
  ::close(client);
  ::close(tool);
}

TEST_CASE("a lock file a client outside the daemon's PID namespace creates stays held until it is removed",
          "[fuse]") {
  // The daemon in a PID namespace of its own (a container), its client in this one: the
  // kernel gives the daemon pid 0 for it, a process it cannot watch.
  test::TempDir dir;
  const std::string e = "neuronxcc-2.21.0/MODULE_unseen+0";
  fs::create_directories(dir / "backing" / e);
  test::spit(dir / "backing" / e / "model.hlo_module.pb", test::slurp(test::corpus_files()[0]));
  test::DaemonSpec spec;
  spec.backing = (dir / "backing").string();
  spec.mnt = dir / "mnt";
  spec.options = {"--compiler", test::k_fake_template};
  spec.launcher = {"unshare", "--pid", "--kill-child"};
  spec.env = {"ASAN_OPTIONS=detect_leaks=0"};  // (its leak check would read this machine's /proc)
  test::MountedDaemon daemon(spec);
  auto lock_in_mount = spec.mnt / e / "model.hlo_module.pb.lock";
  auto lock_in_backing = dir / "backing" / e / "model.hlo_module.pb.lock";
  test::Child client({"sh", "-c", fmt::format("exec 3>'{}'; echo created; exec sleep 60", lock_in_mount.string())});
  REQUIRE(client.line() == "created");
  std::this_thread::sleep_for(300ms);
  // Held for it (not taken for a dead client's and removed at once).
  auto info = inspect_lock(lock_in_backing.string());
  REQUIRE(info.has_value());
  CHECK(info->kernel_locked);
  client.kill(SIGKILL);
  client.wait();
  std::this_thread::sleep_for(300ms);
  CHECK(fs::exists(lock_in_backing));  // as on a disk: until it is removed
  CHECK(::unlink(lock_in_mount.c_str()) == 0);
  CHECK_FALSE(fs::exists(lock_in_backing));
}
