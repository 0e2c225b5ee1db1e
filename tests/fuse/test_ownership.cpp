// Who owns what the mount creates, and with which mode: --compiler-user, a root daemon
// giving files to their callers, umask and set-ID bits as on a local disk, device nodes.
#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

TEST_CASE("a daemon with --compiler-user runs compiles as that user; the NEFF is the HLO owner's; bad uses are refused", "[fuse]") {
  REQUIRE(::geteuid() == 0);  // the CI machines run the tests as root
  // Everything the compiler reaches must be open to nobody: its program, the work root
  // and the compile log (a TempDir is 0700).
  test::TempDir bin;
  fs::permissions(bin.path(), fs::perms(0755));
  fs::copy_file(k_fake, bin / "fake-neuronx-cc");
  Mount m({}, {"--compiler-user", "nobody"}, std::nullopt, {}, (bin / "fake-neuronx-cc").string());
  const fs::path dir = m.compile_log().parent_path();
  fs::permissions(dir, fs::perms(0755));
  test::spit(m.compile_log(), "");
  fs::permissions(m.compile_log(), fs::perms(0666));
  auto e = m.entry("gopjrt_tuple.hlo.pb", "user+0");
  REQUIRE(::chown((m.backing() / e / "model.hlo_module.pb").c_str(), 4242, 4343) == 0);
  CHECK(reader_process(m.mnt() / e / "model.neff")->wait() == 0);
  CHECK(test::logged_uid(m.compile_log(), 0) == static_cast<long>(find_user("nobody")->uid));
  struct stat st {};
  REQUIRE(::stat((m.backing() / e / "model.neff").c_str(), &st) == 0);
  CHECK(st.st_uid == 4242u);
  CHECK(st.st_gid == 4343u);
  CHECK((st.st_mode & S_IWOTH) == 0);
  CHECK(fs::is_empty(dir / "work"));  // the compile's work folder is gone

  fs::copy_file(k_daemon, bin / "neffcachefs");  // for nobody to run
  auto refused = [&](std::vector<std::string> launcher, const std::string& user) {
    test::TempDir d;
    fs::create_directories(d / "mnt");
    launcher.insert(launcher.end(),
                    {(bin / "neffcachefs").string(), "--compiler-user", user, (d / "b").string(), (d / "mnt").string()});
    return test::run(launcher);
  };
  auto unknown = refused({}, "no-such-user-here");
  CHECK(unknown.exit_code == 1);
  CHECK(unknown.output.find("--compiler-user: unknown user 'no-such-user-here'") != std::string::npos);
  auto not_root = refused({"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--"}, "nobody");
  CHECK(not_root.exit_code == 1);
  CHECK(not_root.output.find("--compiler-user needs the daemon to run as root") != std::string::npos);
}

TEST_CASE("a root daemon gives what it creates for a caller to the caller, and the NEFF of their HLO", "[fuse]") {
  REQUIRE(::geteuid() == 0);
  Mount m({}, {"-o", "allow_other"});
  fs::permissions(m.compile_log().parent_path(), fs::perms(0755));  // for nobody to reach the mount
  fs::create_directories(m.backing() / "neuronxcc-2.21.0");
  fs::permissions(m.backing() / "neuronxcc-2.21.0", fs::perms(0777));
  test::TempDir src;
  fs::permissions(src.path(), fs::perms(0755));
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", src / "graph.pb");
  const std::string e = "neuronxcc-2.21.0/MODULE_theirs+0";
  // As a training process of that user writes its graph: a folder, then the HLO.
  auto wrote = test::run({"setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", "--", "sh", "-c",
                          "mkdir \"$1\" && cp \"$2\" \"$1/model.hlo_module.pb\"", "sh", (m.mnt() / e).string(),
                          (src / "graph.pb").string()});
  REQUIRE(wrote.exit_code == 0);
  CHECK(reader_process(m.mnt() / e / "model.neff")->wait() == 0);
  const auto nobody = find_user("nobody").value();
  for (const char* name : {"", "model.hlo_module.pb", "model.neff", "model.done"}) {
    INFO(name);
    struct stat st {};
    REQUIRE(::lstat((m.backing() / e / name).c_str(), &st) == 0);
    CHECK(st.st_uid == nobody.uid);
    CHECK(st.st_gid == nobody.gid);
  }
}

// Runs `calls` in a child process as `uid`:`gid` (no other groups) with umask `mask`;
// returns what `calls` returned (0: everything went as expected), 100 if the identity
// could not be taken.
int as_caller(uid_t uid, gid_t gid, mode_t mask, const std::function<int()>& calls) {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setgid(gid) != 0 || ::setuid(uid) != 0) ::_exit(100);
    ::umask(mask);
    ::_exit(calls());
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// The test's umask for its scope (a daemon started in it inherits it).
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

struct stat lstat_of(const fs::path& p) {
  struct stat st {};
  REQUIRE(::lstat(p.c_str(), &st) == 0);
  return st;
}

TEST_CASE("what a caller creates through the mount gets the mode and owner the same call gives on a local disk", "[fuse]") {
  REQUIRE(::geteuid() == 0);
  ScopedUmask daemon_umask(022);
  Mount m({}, {"-o", "allow_other"});
  fs::permissions(m.compile_log().parent_path(), fs::perms(0755));  // for nobody to reach the mount
  test::TempDir local;
  fs::permissions(local.path(), fs::perms(0755));
  const auto nobody = find_user("nobody").value();
  const gid_t team = 100;  // "users", a group nobody is not in
  struct Caller {
    std::string name;
    uid_t uid;
    gid_t gid;
    mode_t umask;
  };
  const std::vector<Caller> callers = {
      {"root-000", 0, 0, 0}, {"root-022", 0, 0, 022}, {"nobody-000", nobody.uid, nobody.gid, 0},
      {"nobody-002", nobody.uid, nobody.gid, 002}, {"nobody-077", nobody.uid, nobody.gid, 077}};
  // Every kind of thing a client creates, by the same calls, in a plain folder and in a
  // team's set-group-ID folder (the usual way a team shares one cache).
  auto make = [&](const fs::path& top) {
    fs::create_directory(top / "plain");
    fs::create_directory(top / "team");
    REQUIRE(::chmod((top / "plain").c_str(), 0777) == 0);
    REQUIRE(::chown((top / "team").c_str(), 0, team) == 0);
    REQUIRE(::chmod((top / "team").c_str(), 02777) == 0);
    for (const auto& c : callers) {
      for (const char* folder : {"plain", "team"}) {
        const fs::path d = top / folder / c.name;
        INFO(d);
        CHECK(as_caller(c.uid, c.gid, c.umask, [&] {
                if (::mkdir(d.c_str(), 0777) != 0) return 1;
                for (auto [name, mode] : {std::pair{"f620", 0620}, {"f642", 0642}, {"f777", 0777}, {"suid", 04755},
                                          {"sgid", 02775}}) {
                  int fd = ::open((d / name).c_str(), O_CREAT | O_EXCL | O_WRONLY, mode);
                  if (fd < 0) return 2;
                  ::close(fd);
                }
                // A lock file: a lock created through the mount lives as long as its
                // creator, so it is looked at here.
                int lock = ::open((d / "model.hlo_module.pb.lock").c_str(), O_CREAT | O_EXCL | O_RDWR, 0666);
                struct stat st {};
                if (lock < 0 || ::fstat(lock, &st) != 0 || (st.st_mode & 07777) != (0666 & ~c.umask)) return 3;
                ::close(lock);
                if (::mkdir((d / "sub").c_str(), 0775) != 0 || ::mkdir((d / "sticky").c_str(), 01777) != 0) return 4;
                if (::mkfifo((d / "fifo").c_str(), 0646) != 0) return 5;
                if (::mknod((d / "socket").c_str(), S_IFSOCK | 0757, 0) != 0) return 6;
                if (::link((d / "f642").c_str(), (d / "hard").c_str()) != 0) return 7;
                if (::symlink("f642", (d / "soft").c_str()) != 0) return 8;
                return 0;
              }) == 0);
      }
    }
  };
  make(m.mnt());
  make(local.path());

  std::size_t compared = 0;
  for (const auto& it : fs::recursive_directory_iterator(local.path())) {
    const fs::path rel = it.path().lexically_relative(local.path());
    if (rel.filename() == "model.hlo_module.pb.lock") continue;  // gone with its creator
    INFO(rel);
    const struct stat want = lstat_of(it.path());
    for (const fs::path& got_path : {m.mnt() / rel, m.backing() / rel}) {
      INFO(got_path);
      const struct stat got = lstat_of(got_path);
      CHECK(fmt::format("{:o}", got.st_mode) == fmt::format("{:o}", want.st_mode));
      CHECK(got.st_uid == want.st_uid);
      CHECK(got.st_gid == want.st_gid);
      ++compared;
    }
  }
  CHECK(compared == 2 * (2 + 2 * 5 * 12));  // both folders; 12 names of each caller in each
  // The cases the issue names, spelled out.
  CHECK((lstat_of(m.backing() / "plain/root-000").st_mode & 07777) == 0777);
  CHECK((lstat_of(m.backing() / "plain/root-000/f620").st_mode & 07777) == 0620);
  CHECK((lstat_of(m.backing() / "plain/root-000/f642").st_mode & 07777) == 0642);
  CHECK((lstat_of(m.backing() / "team/nobody-002").st_mode & 07777) == 02775);
  CHECK(lstat_of(m.backing() / "team/nobody-002").st_gid == team);
  CHECK((lstat_of(m.backing() / "team/nobody-002/f777").st_mode & 07777) == 0775);
  CHECK((lstat_of(m.backing() / "plain/nobody-000/suid").st_mode & 07777) == 04755);
  CHECK((lstat_of(m.backing() / "team/nobody-000/sgid").st_mode & 07777) == 0775);  // not in the group

  // What a compile writes keeps its documented modes: a NEFF 0666 less the daemon's
  // umask, never writable by others; model.done and the metadata 0644.
  const fs::path e = m.mnt() / m.entry("gopjrt_tuple.hlo.pb", "modes+0");
  REQUIRE(reader_process(e / "model.neff")->wait() == 0);
  CHECK((lstat_of(e / "model.neff").st_mode & 07777) == 0644);
  CHECK((lstat_of(e / "model.done").st_mode & 07777) == 0644);
  CHECK((lstat_of(e / k_meta_file).st_mode & 07777) == 0644);
}

TEST_CASE("a write by a user who is not the owner clears set-user-ID and set-group-ID bits, as on a local disk", "[fuse]") {
  REQUIRE(::geteuid() == 0);
  Mount m({}, {"-o", "allow_other"});
  fs::permissions(m.compile_log().parent_path(), fs::perms(0755));  // for nobody to reach the mount
  test::TempDir local;
  fs::permissions(local.path(), fs::perms(0755));
  const auto nobody = find_user("nobody").value();
  for (const fs::path& top : {m.mnt(), local.path()}) {
    for (mode_t mode : {04777, 02777, 06777}) {
      for (int how : {0, O_TRUNC, O_APPEND}) {
        const fs::path f = top / fmt::format("f{:o}-{}", mode, how);
        INFO(f);
        write_plain(f, "root's");
        REQUIRE(::chmod(f.c_str(), mode) == 0);
        REQUIRE((lstat_of(f).st_mode & 07777) == mode);
        CHECK(as_caller(nobody.uid, nobody.gid, 022, [&] {
                int fd = ::open(f.c_str(), O_WRONLY | how);
                if (fd < 0) return 1;
                bool wrote = ::write(fd, "x", 1) == 1;
                ::close(fd);
                return wrote ? 0 : 2;
              }) == 0);
        CHECK((lstat_of(f).st_mode & 07777) == 0777);
        if (top == m.mnt()) CHECK((lstat_of(m.backing() / f.filename()).st_mode & 07777) == 0777);
      }
    }
  }
  // Root's write keeps them, as on a local disk.
  const fs::path f = m.mnt() / "root-writes";
  write_plain(f, "x");
  REQUIRE(::chmod(f.c_str(), 06777) == 0);
  write_plain(f, "y");
  CHECK((lstat_of(f).st_mode & 07777) == 06777);
}

TEST_CASE("device nodes are refused through the mount with EPERM; FIFOs and sockets are made", "[fuse]") {
  Mount m;
  CHECK(::mknod((m.mnt() / "chr").c_str(), S_IFCHR | 0666, makedev(1, 3)) == -1);
  CHECK(errno == EPERM);
  CHECK(::mknod((m.mnt() / "blk").c_str(), S_IFBLK | 0600, makedev(7, 0)) == -1);
  CHECK(errno == EPERM);
  struct stat st {};
  CHECK(::lstat((m.backing() / "chr").c_str(), &st) == -1);
  CHECK(::lstat((m.backing() / "blk").c_str(), &st) == -1);
  REQUIRE(::mkfifo((m.mnt() / "fifo").c_str(), 0600) == 0);
  CHECK(S_ISFIFO(lstat_of(m.backing() / "fifo").st_mode));
  REQUIRE(::mknod((m.mnt() / "socket").c_str(), S_IFSOCK | 0600, 0) == 0);
  CHECK(S_ISSOCK(lstat_of(m.backing() / "socket").st_mode));
}

TEST_CASE("a user who may write both folders renames a folder between them, reachable at once under its new name", "[fuse]") {
  REQUIRE(::geteuid() == 0);
  Mount m({}, {"-o", "allow_other"});
  fs::permissions(m.compile_log().parent_path(), fs::perms(0755));  // for nobody to reach the mount
  const auto nobody = find_user("nobody").value();
  // Folders open to everyone, made as a script under umask 0 makes them.
  {
    ScopedUmask none(0);
    REQUIRE(::mkdir((m.mnt() / "from").c_str(), 0777) == 0);
    REQUIRE(::mkdir((m.mnt() / "to").c_str(), 0777) == 0);
  }
  const fs::path from = m.mnt() / "from" / "d", to = m.mnt() / "to" / "e";
  CHECK(as_caller(nobody.uid, nobody.gid, 022, [&] {
          if (::mkdir(from.c_str(), 0755) != 0) return 1;
          int fd = ::open((from / "x").c_str(), O_CREAT | O_WRONLY, 0644);
          if (fd < 0) return 2;
          ::close(fd);
          for (int round = 0; round < 3; ++round) {
            if (::rename(from.c_str(), to.c_str()) != 0) return 10 + round;
            struct stat st {};
            if (::stat((to / "x").c_str(), &st) != 0 || ::stat(from.c_str(), &st) == 0) return 20 + round;
            if (::rename(to.c_str(), from.c_str()) != 0) return 30 + round;
            if (::stat((from / "x").c_str(), &st) != 0 || ::stat(to.c_str(), &st) == 0) return 40 + round;
          }
          return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : 50;
        }) == 0);
  CHECK(fs::exists(m.mnt() / "to/e/x"));
  CHECK(fs::exists(m.backing() / "to/e/x"));
  CHECK_FALSE(fs::exists(m.backing() / "from/d"));
}
