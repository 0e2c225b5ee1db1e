// The mount as a local disk for what it passes through: the same file operations agree,
// listings give every reference back, names far beyond the open-file limit, changes
// behind the daemon's back, nothing outside the backing folder.
#include <sys/inotify.h>
#include <sys/mman.h>

#include <catch2/generators/catch_generators.hpp>

#include <neffcache/cache/layout.hpp>

#include "fuse_test.hpp"
#include "lnl.hpp"
#include "passthrough.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

TEST_CASE("the same random file operations on the mount and on a plain directory agree", "[fuse]") {
  Mount m;
  test::TempDir plain;
  // Runs a seeded sequence of operations under `root`, recording what each returned.
  auto replay = [](const fs::path& root) {
    std::mt19937 rng(4242);
    std::ostringstream log;
    std::vector<std::string> names{"a", "b", "c", "d/x", "d/y", "e"};
    auto pick = [&] { return root / names[rng() % names.size()]; };
    for (int step = 0; step < 400; ++step) {
      auto p = pick(), q = pick();
      int rc = 0;
      std::string data;
      switch (rng() % 15) {
        case 0: rc = ::mkdir((root / "d").c_str(), 0755); break;
        case 1: {
          int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
          rc = fd;
          if (fd >= 0) {
            std::string text(rng() % 5000, static_cast<char>('a' + rng() % 26));
            rc = static_cast<int>(::write(fd, text.data(), text.size()));
            ::close(fd);
          }
          break;
        }
        case 2: {
          int fd = ::open(p.c_str(), O_WRONLY | O_APPEND);
          rc = fd < 0 ? fd : static_cast<int>(::write(fd, "tail", 4));
          if (fd >= 0) ::close(fd);
          break;
        }
        case 3: {
          auto r = read_all(p);
          rc = r.first;
          data = std::to_string(r.second.size()) + ":" + std::to_string(std::hash<std::string>{}(r.second));
          break;
        }
        case 4: rc = ::rename(p.c_str(), q.c_str()); break;
        case 5: rc = ::unlink(p.c_str()); break;
        case 6: rc = ::rmdir((root / "d").c_str()); break;
        case 7: rc = ::truncate(p.c_str(), static_cast<off_t>(rng() % 100)); break;
        case 8: rc = ::symlink("target-text", p.c_str()); break;
        case 9: {
          char buf[64] = {};
          rc = static_cast<int>(::readlink(p.c_str(), buf, sizeof buf - 1));
          data = buf;
          break;
        }
        case 10: rc = ::link(p.c_str(), q.c_str()); break;
        case 11: {
          struct stat st {};
          rc = ::lstat(p.c_str(), &st);
          if (rc == 0) data = fmt::format("{:o} {} {}", st.st_mode, S_ISDIR(st.st_mode) ? 0 : st.st_size, st.st_nlink);
          break;
        }
        case 12: {  // the fallocate modes FUSE carries, in whole blocks and not
          static constexpr int modes[] = {0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                                          FALLOC_FL_ZERO_RANGE, FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                                          FALLOC_FL_PUNCH_HOLE /* EINVAL without KEEP_SIZE */};
          const int mode = modes[rng() % std::size(modes)];
          const off_t off = static_cast<off_t>(rng() % 16) * 4096 + (rng() % 2 ? 0 : 100);
          const off_t len = static_cast<off_t>(rng() % 16) * 4096;
          int fd = ::open(p.c_str(), O_RDWR);
          rc = fd < 0 ? fd : ::fallocate(fd, mode, off, len);
          if (rc == 0) data = std::to_string(::lseek(fd, 0, SEEK_END));
          if (fd >= 0) ::close(fd);
          break;
        }
        case 13: {  // copy_file_range between two files (or within one)
          int in = ::open(p.c_str(), O_RDONLY);
          int out = in < 0 ? -1 : ::open(q.c_str(), O_WRONLY | O_CREAT, 0644);
          loff_t from = static_cast<loff_t>(rng() % 6000), to = static_cast<loff_t>(rng() % 70000);
          const std::size_t len = rng() % 9000;
          rc = out < 0 ? -1 : static_cast<int>(::copy_file_range(in, &from, out, &to, len, 0));
          if (rc >= 0) data = fmt::format("{} {}", from, to);
          if (out >= 0) ::close(out);
          if (in >= 0) ::close(in);
          break;
        }
        case 14: {  // where the data and the holes are
          int fd = ::open(p.c_str(), O_RDONLY);
          const off_t from = static_cast<off_t>(rng() % 70000);
          const int whence = rng() % 2 ? SEEK_DATA : SEEK_HOLE;
          rc = fd < 0 ? fd : static_cast<int>(::lseek(fd, from, whence));
          if (rc >= 0) data = std::to_string(rc);
          if (fd >= 0) ::close(fd);
          break;
        }
      }
      log << step << ' ' << (rc < 0 ? -errno : 0) << ' ' << data << '\n';
    }
    return log.str();
  };
  // Names, types and contents of everything under a root.
  auto tree = [](const fs::path& root) {
    std::vector<std::string> out;
    for (const auto& f : fs::recursive_directory_iterator(root)) {
      std::string line = fs::relative(f.path(), root).string();
      if (f.is_symlink()) line += " -> " + fs::read_symlink(f.path()).string();
      else if (f.is_regular_file()) line += " = " + std::to_string(std::hash<std::string>{}(test::slurp(f.path())));
      out.push_back(line);
    }
    std::sort(out.begin(), out.end());
    return out;
  };
  std::string on_mount = replay(m.mnt());
  std::string on_plain = replay(plain.path());
  CHECK(on_mount == on_plain);
  CHECK(on_mount.find(" 0 ") != std::string::npos);  // some operations succeeded...
  CHECK(on_mount.find(" -2 ") != std::string::npos);  // ...and some failed with ENOENT, alike
  auto expected = tree(plain.path());
  CHECK(expected.size() >= 3);
  CHECK(tree(m.mnt()) == expected);
  CHECK(tree(m.backing()) == expected);  // the mount wrote through
}

TEST_CASE("fallocate and copy_file_range reach the backing file and its holes; the modes FUSE cannot carry fail alike",
          "[fuse]") {
  Mount m;
  const fs::path f = m.mnt() / "f", g = m.mnt() / "g";
  const std::string data(64 * 1024, 'x');
  test::spit(f, data);
  int fd = ::open(f.c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  // A hole punched through the mount is a hole in the backing file, read as zeros.
  CHECK(::fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 16384, 16384) == 0);
  CHECK(::lseek(fd, 0, SEEK_HOLE) == 16384);
  CHECK(::lseek(fd, 16384, SEEK_DATA) == 32768);
  CHECK(::lseek(fd, 70000, SEEK_DATA) == -1);
  CHECK(errno == ENXIO);
  {
    int b = ::open((m.backing() / "f").c_str(), O_RDONLY);
    CHECK(::lseek(b, 0, SEEK_HOLE) == 16384);
    ::close(b);
  }
  CHECK(read_all(f).second == data.substr(0, 16384) + std::string(16384, '\0') + data.substr(32768));
  // Space allocated past the end: the size grows (KEEP_SIZE: it does not).
  CHECK(::fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, 1 << 20) == 0);
  CHECK(fs::file_size(f) == data.size());
  CHECK(::fallocate(fd, 0, 0, 1 << 20) == 0);
  CHECK(fs::file_size(f) == 1u << 20);
  CHECK(fs::file_size(m.backing() / "f") == 1u << 20);
  CHECK(::fallocate(fd, FALLOC_FL_ZERO_RANGE, 0, 4096) == 0);
  CHECK(read_all(f).second.substr(0, 4097) == std::string(4096, '\0') + "x");
  // Errors are the disk's: a punch without KEEP_SIZE.
  CHECK(::fallocate(fd, FALLOC_FL_PUNCH_HOLE, 0, 4096) == -1);
  CHECK(errno == EOPNOTSUPP);
  // Collapse and insert range: the kernel's FUSE refuses them before the daemon sees them
  // (the disk under the mount has them; docs/SEMANTICS.md says so).
  CHECK(::fallocate(fd, FALLOC_FL_COLLAPSE_RANGE, 4096, 4096) == -1);
  CHECK(errno == EOPNOTSUPP);
  CHECK(::fallocate(fd, FALLOC_FL_INSERT_RANGE, 4096, 4096) == -1);
  CHECK(errno == EOPNOTSUPP);
  ::close(fd);

  // copy_file_range: the bytes, at the offsets asked, the offsets moved.
  int in = ::open(f.c_str(), O_RDONLY), out = ::open(g.c_str(), O_WRONLY | O_CREAT, 0644);
  REQUIRE((in >= 0 && out >= 0));
  loff_t from = 40000, to = 100;
  CHECK(::copy_file_range(in, &from, out, &to, 5000, 0) == 5000);
  CHECK((from == 45000 && to == 5100));
  CHECK(read_all(g).second == std::string(100, '\0') + data.substr(40000, 5000));
  CHECK(::copy_file_range(in, nullptr, out, nullptr, 10, 12345) == -1);  // no flags exist
  CHECK(errno == EINVAL);
  ::close(in);
  ::close(out);
  // From the counters' file, which has no backing file: the kernel copies it by reading.
  in = ::open((m.mnt() / ".neffcache" / "stats.json").c_str(), O_RDONLY);
  out = ::open(g.c_str(), O_WRONLY | O_TRUNC);
  REQUIRE((in >= 0 && out >= 0));
  const ssize_t n = ::copy_file_range(in, nullptr, out, nullptr, 1 << 20, 0);
  ::close(in);
  ::close(out);
  CHECK(n > 0);
  CHECK(nlohmann::json::parse(read_all(g).second).contains("hits"));
}

TEST_CASE("listings answer with attributes (readdirplus) and every reference is given back", "[fuse]") {
  Mount m;
  auto e = m.entry("gopjrt_tuple.hlo.pb", "list+0");
  const fs::path many = m.backing() / "many";
  fs::create_directories(many);
  for (int i = 0; i < 2000; ++i) write_plain(many / fmt::format("f{:04}", i), std::string(static_cast<std::size_t>(i % 97), 'x'));
  // Descriptors the daemon holds for backing files (libfuse adds splice pipes per worker).
  auto daemon_fds = [&] {
    int n = 0;
    std::error_code ec;
    for (const auto& f : fs::directory_iterator(fmt::format("/proc/{}/fd", m.daemon().pid())))
      n += fs::read_symlink(f.path(), ec).string().starts_with(m.backing().string());
    return n;
  };
  auto forget_all = [] {
    ::sync();
    write_plain("/proc/sys/vm/drop_caches", "2");  // the kernel forgets dentries and inodes
  };
  forget_all();
  const auto base = daemon_fds();
  // A listing alone: the first batch arrives with attributes, so names were looked up. The
  // kernel may forget them again at any moment (memory reclaim shrinks its caches too): a
  // listing that finds them gone at once is made again.
  std::vector<std::string> names;
  int listed = 0;
  for (int i = 0; i < 5 && listed <= base + 10; ++i) {
    names.clear();
    for (const auto& f : fs::directory_iterator(m.mnt() / "many")) names.push_back(f.path().filename().string());
    listed = daemon_fds();
  }
  CHECK(names.size() == 2000);
  CHECK(listed > base + 10);
  // `ls -l`: the same sizes and modes as the backing directory. Each name's inode is held
  // by a watch meanwhile, so that the kernel keeps it (and the daemon its descriptor)
  // until the watches go.
  auto watches = std::make_optional<neffcache::detail::UniqueFd>(::inotify_init1(IN_CLOEXEC));
  REQUIRE(watches->get() >= 0);
  int same = 0;
  for (const auto& n : names) {
    struct stat a {}, b {};
    REQUIRE(::lstat((m.mnt() / "many" / n).c_str(), &a) == 0);
    REQUIRE(::inotify_add_watch(watches->get(), (m.mnt() / "many" / n).c_str(), IN_DELETE_SELF | IN_DONT_FOLLOW) >= 0);
    REQUIRE(::lstat((many / n).c_str(), &b) == 0);
    same += a.st_size == b.st_size && a.st_mode == b.st_mode && a.st_mtim.tv_sec == b.st_mtim.tv_sec;
  }
  CHECK(same == 2000);
  CHECK(daemon_fds() > base + 1900);
  watches.reset();
  // A pending entry lists its own files alone; its placeholders are found by name, stat-able
  // at size 0, and nothing compiles.
  std::map<std::string, off_t> sizes;
  for (const auto& f : fs::directory_iterator(m.mnt() / e)) sizes[f.path().filename().string()] = static_cast<off_t>(fs::file_size(f.path()));
  CHECK(sizes.size() == 1);
  CHECK(fs::file_size(m.mnt() / e / "model.neff") == 0);
  CHECK(fs::file_size(m.mnt() / e / "model.done") == 0);
  CHECK(m.compiles() == 0);
  // When the kernel forgets the names, the daemon closes what it held for them.
  for (int i = 0; i < 30 && daemon_fds() > base; ++i) {
    forget_all();  // again if a name was busy the first time
    std::this_thread::sleep_for(100ms);
  }
  CHECK(daemon_fds() == base);
}

TEST_CASE("far more names than the daemon may open files: each one answers, renamed or replaced", "[fuse]") {
  // 300 descriptors: the daemon keeps 150 names open; the kernel will remember 6,000.
  Mount m({}, {}, std::nullopt, {"prlimit", "--nofile=300:300", "--"});
  auto e = m.entry("gopjrt_tuple.hlo.pb", "pending+0");
  const int dirs = 50, files = 120;
  for (int d = 0; d < dirs; ++d) {
    fs::create_directories(m.backing() / "tree" / fmt::format("d{:02}", d));
    for (int f = 0; f < files; ++f)
      write_plain(m.backing() / "tree" / fmt::format("d{:02}/f{:03}", d, f), fmt::format("{}/{}", d, f));
  }
  auto contents = [&](const fs::path& p) { return read_all(p).second; };
  // A walk: every name once, with attributes, as `find` or `du` does it.
  int seen = 0;
  for (const auto& f : fs::recursive_directory_iterator(m.mnt() / "tree")) seen += f.is_regular_file();
  CHECK(seen == dirs * files);
  // Every name again, the early ones long since let go: stat and read agree with the backing.
  int same = 0;
  for (int d = 0; d < dirs; ++d)
    for (int f = 0; f < files; ++f) {
      auto rel = fmt::format("tree/d{:02}/f{:03}", d, f);
      struct stat a {}, b {};
      REQUIRE(::stat((m.mnt() / rel).c_str(), &a) == 0);
      REQUIRE(::stat((m.backing() / rel).c_str(), &b) == 0);
      same += a.st_size == b.st_size && a.st_mtim.tv_nsec == b.st_mtim.tv_nsec &&
              contents(m.mnt() / rel) == fmt::format("{}/{}", d, f);
    }
  CHECK(same == dirs * files);
  // A folder renamed through the mount: the files below it, reopened, come from its new place.
  int held = ::open((m.mnt() / "tree/d00/f000").c_str(), O_RDONLY);
  REQUIRE(held >= 0);
  REQUIRE(::rename((m.mnt() / "tree/d00").c_str(), (m.mnt() / "tree/moved").c_str()) == 0);
  for (int f = 0; f < files; ++f) CHECK(contents(m.mnt() / fmt::format("tree/d01/f{:03}", f)) == fmt::format("1/{}", f));
  struct stat st {};
  CHECK(::fstat(held, &st) == 0);  // by the open file, whatever its name
  CHECK(contents(m.mnt() / "tree/moved/f005") == "0/5");
  ::close(held);
  // Replaced behind the daemon's back (a publish renames a new file over the old one):
  // the kernel is told the old one is stale and looks the name up again.
  write_plain(m.backing() / "tree/new", "replaced");
  fs::rename(m.backing() / "tree/new", m.backing() / "tree/d02/f000");
  for (int f = 0; f < files; ++f) contents(m.mnt() / fmt::format("tree/d03/f{:03}", f));  // let d02/f000 go
  REQUIRE(::stat((m.mnt() / "tree/d02/f000").c_str(), &st) == 0);
  CHECK(st.st_size == 8);
  CHECK(contents(m.mnt() / "tree/d02/f000") == "replaced");
  // Compiling on open still works with the limit.
  auto [err, neff] = read_all(m.mnt() / e / "model.neff");
  CHECK(err == 0);
  CHECK(m.compiles() == 1);
  CHECK(neff == test::slurp(m.backing() / e / "model.neff"));
}

TEST_CASE("a done entry removed or repaired behind the daemon's back is seen anew through the mount", "[fuse]") {
  // The kernel keeps a done entry's names for a day; what it remembers must not outlive the files.
  Mount m;
  auto e = m.entry("rocm08_normal_9.hlo_proto.pb", "gone+0");
  auto graph_of = [&](const fs::path& p) {
    auto neff = fake::parse_fake_neff(read_all(p).second);
    return neff ? neff->graph : std::string("not a whole NEFF");
  };
  CHECK(graph_of(m.mnt() / e / "model.neff") == canonical_of("rocm08_normal_9.hlo_proto.pb"));
  REQUIRE(fs::exists(m.mnt() / e / "model.done"));
  // Removed and written again as a pending entry of another graph, as after `neffcache
  // clean` and a new trial run.
  fs::remove_all(m.backing() / e);
  fs::create_directories(m.backing() / e);
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", m.backing() / e / "model.hlo_module.pb");
  CHECK(graph_of(m.mnt() / e / "model.neff") == canonical_of("gopjrt_tuple.hlo.pb"));
  CHECK(m.compiles() == 2);
  // A client can create files in it (its lock) and list it.
  int fd = ::open((m.mnt() / e / "extra").c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  CHECK(fd >= 0);
  if (fd >= 0) ::close(fd);
  std::set<std::string> names;
  for (const auto& f : fs::directory_iterator(m.mnt() / e))
    if (!f.path().filename().string().starts_with(".neffcache")) names.insert(f.path().filename().string());
  CHECK(names == std::set<std::string>{"model.hlo_module.pb", "model.neff", "model.done", "extra"});
  // Repaired (model.neff and model.done removed, as `neffcache verify --repair` does): the
  // next open compiles again instead of serving the removed file.
  fs::remove(m.backing() / e / "model.done");
  fs::remove(m.backing() / e / "model.neff");
  CHECK(graph_of(m.mnt() / e / "model.neff") == canonical_of("gopjrt_tuple.hlo.pb"));
  CHECK(m.compiles() == 3);
}

TEST_CASE("nothing outside the backing directory is reached through the mount", "[fuse]") {
  Mount m;
  test::TempDir outside;
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", outside / "model.hlo_module.pb");
  const fs::path top = m.backing() / "neuronxcc-2.21.0";
  fs::create_directories(top);
  fs::create_directory_symlink(outside.path(), top / "MODULE_abs+0");            // absolute
  fs::create_directory_symlink("../../../" + outside.path().filename().string(), top / "MODULE_rel+0");  // climbing
  fs::create_symlink("/etc/passwd", top / "passwd");
  for (const char* name : {"MODULE_abs+0", "MODULE_rel+0", "passwd"}) {
    INFO(name);
    struct stat st {};
    REQUIRE(::lstat((m.mnt() / "neuronxcc-2.21.0" / name).c_str(), &st) == 0);
    CHECK(S_ISLNK(st.st_mode));  // shown as the link it is, never followed by the daemon
  }
  // Opening through an entry folder that is a link: the kernel follows it outside the
  // mount, so the daemon is never asked and nothing is compiled or written there.
  CHECK(read_all(m.mnt() / "neuronxcc-2.21.0/MODULE_abs+0/model.neff").first == ENOENT);
  CHECK(read_all(m.mnt() / "neuronxcc-2.21.0/MODULE_rel+0/model.neff").first == ENOENT);
  CHECK(m.compiles() == 0);
  // Nor does a batch compile of the backing directory follow it.
  auto r = test::run({test::path::tool, "compile", "--cache", m.backing().string(), "--compiler",
                      k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}"});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(outside / "model.neff"));
  CHECK_FALSE(fs::exists(outside / "model.log"));
  // Renames out of the mount cross a file system: refused.
  write_plain(m.mnt() / "leaving", "x");
  CHECK(::rename((m.mnt() / "leaving").c_str(), (outside / "left").c_str()) != 0);
  CHECK(errno == EXDEV);
  CHECK(fs::exists(m.backing() / "leaving"));
}


// READ requests the daemon answered while `what` ran, as two looks at stats.json tell
// (stats.json's own reads are not counted).
template <class F>
static uint64_t reads_between(Mount& m, F what) {
  const uint64_t before = m.daemon().stats()["reads"];
  what();
  return m.daemon().stats()["reads"].get<uint64_t>() - before;
}

TEST_CASE("a done NEFF is read by the kernel without the daemon (FUSE passthrough); writers and readers mixed all "
          "work",
          "[fuse]") {
  Mount m;
  auto e = m.entry("rocm08_normal_9.hlo_proto.pb", "pt+0");
  const fs::path neff = m.mnt() / e / "model.neff";
  const std::string bytes = read_all(neff).second;  // compiled (a waiting open: direct I/O, not passed through)
  REQUIRE(fake::parse_fake_neff(bytes));
  auto s = m.daemon().stats();
  // On wherever this build's libfuse has it, the daemon is root and the kernel offers it.
  if (!neffcachefs::k_libfuse_has_passthrough || ::geteuid() != 0) {
    CHECK(s["passthrough"]["on"] == false);
    CHECK(!s["passthrough"]["why_off"].get<std::string>().empty());
    CHECK(read_all(neff).second == bytes);
    return;
  }
  if (s["passthrough"]["on"] == false) {
    WARN("passthrough off here: " << s["passthrough"]["why_off"].get<std::string>());
    CHECK(s["passthrough"]["why_off"].get<std::string>().find("kernel") != std::string::npos);
    return;
  }
  // A hit: whole, and not one READ request.
  const uint64_t opens = s["passthrough"]["opens"], bytes_served = s["read_bytes"];
  CHECK(reads_between(m, [&] { CHECK(read_all(neff).second == bytes); }) == 0);
  s = m.daemon().stats();
  CHECK(s["passthrough"]["opens"] == opens + 1);
  CHECK(s["read_bytes"].get<uint64_t>() >= bytes_served + bytes.size());
  // Mapped, too.
  {
    int fd = ::open(neff.c_str(), O_RDONLY);
    REQUIRE(fd >= 0);
    void* map = ::mmap(nullptr, bytes.size(), PROT_READ, MAP_SHARED, fd, 0);
    REQUIRE(map != MAP_FAILED);
    CHECK(std::string(static_cast<const char*>(map), bytes.size()) == bytes);
    ::munmap(map, bytes.size());
    ::close(fd);
  }
  // While a reader passes through, a writer of the same file passes through on its backing
  // file, and the reader sees what it writes (the test below compares with a disk).
  int reader = ::open(neff.c_str(), O_RDONLY);
  REQUIRE(reader >= 0);
  const uint64_t writers = m.daemon().stats()["passthrough"]["writers"];
  int writer = ::open(neff.c_str(), O_RDWR);
  REQUIRE(writer >= 0);
  CHECK(m.daemon().stats()["passthrough"]["writers"] == writers + 1);
  CHECK(reads_between(m, [&] { CHECK(::pwrite(writer, "NEWB", 4, 0) == 4); }) == 0);
  std::string head(4, '\0');
  CHECK(::pread(reader, head.data(), 4, 0) == 4);
  CHECK(head == "NEWB");
  ::close(reader);
  ::close(writer);
  CHECK(read_all(neff).second == "NEWB" + bytes.substr(4));
  // A writer first: readers go through the daemon until it ends (the kernel allows no mix),
  // and see what it wrote.
  // (The readers' RELEASE reaches the daemon in the background: until it does, the writer
  // still joins them.)
  for (int tries = 0; tries < 200; ++tries) {
    const uint64_t passed_before = m.daemon().stats()["passthrough"]["writers"];
    writer = ::open(neff.c_str(), O_RDWR);
    REQUIRE(writer >= 0);
    if (m.daemon().stats()["passthrough"]["writers"] == passed_before) break;
    ::close(writer);
    std::this_thread::sleep_for(10ms);
  }
  CHECK(::pwrite(writer, bytes.data(), 4, 0) == 4);
  CHECK(reads_between(m, [&] { CHECK(read_all(neff).second == bytes); }) > 0);
  ::close(writer);
  // Once its RELEASE is in and a lookup finds it done again, readers pass through again.
  const uint64_t before = m.daemon().stats()["passthrough"]["opens"];
  bool passed = false;
  for (int tries = 0; tries < 200 && !passed; ++tries) {
    CHECK(read_all(neff).second == bytes);
    passed = m.daemon().stats()["passthrough"]["opens"] > before;
    if (!passed) std::this_thread::sleep_for(10ms);
  }
  CHECK(passed);
}

// A done entry of either dialect below `root` whose NEFF holds `bytes`; returns the NEFF's
// path below `root`.
static std::string put_done_entry(const fs::path& root, bool lnl, const std::string& seed, const std::string& bytes) {
  if (lnl) {
    const std::string key = test::lnl_key(seed);
    test::make_lnl_entry(root, "gopjrt_tuple.hlo.pb", key);
    test::spit(root / key / lnl_neff_name(key), bytes);
    test::spit(root / key / ".compilation_complete", "completed:1\n");
    return key + "/" + lnl_neff_name(key);
  }
  const std::string dir = test::k_fake_dir + "/MODULE_" + seed + "+abc";
  test::spit(root / dir / "model.hlo_module.pb", "x");
  test::spit(root / dir / "model.neff", bytes);
  test::spit(root / dir / "model.done", "");
  return dir + "/model.neff";
}

TEST_CASE("a done NEFF of either dialect passes through, and a writer of it behaves as on a disk, with passthrough "
          "and without; its twin keeps its own bytes",
          "[fuse][lnl]") {
  const bool lnl = GENERATE(false, true), passthrough = GENERATE(true, false);
  CAPTURE(lnl, passthrough);
  Mount m({}, passthrough ? std::vector<std::string>{} : std::vector<std::string>{"--no-passthrough"});
  if (passthrough && m.daemon().stats()["passthrough"]["on"] == false) SKIP("passthrough is off here");
  test::TempDir plain;
  const std::string old_bytes(3 << 20, 'o'), new_bytes = std::string(1 << 20, 'n') + "end";
  // The same steps on a folder and through the mount: a reader opens the NEFF and reads
  // its start; a writer rewrites it whole (O_TRUNC) while the reader keeps it open; the
  // reader reads again; a new open reads it. Returns what each read gave.
  auto steps = [&](const fs::path& root, const std::string& neff) {
    std::vector<std::string> seen;
    int reader = ::open((root / neff).c_str(), O_RDONLY);
    REQUIRE(reader >= 0);
    std::string buf(4096, '\0');
    const ssize_t first = ::pread(reader, buf.data(), buf.size(), 0);
    seen.push_back(std::to_string(first) + buf.substr(0, 8));
    int writer = ::open((root / neff).c_str(), O_WRONLY | O_TRUNC);
    REQUIRE(writer >= 0);
    CHECK(::write(writer, new_bytes.data(), new_bytes.size()) == static_cast<ssize_t>(new_bytes.size()));
    ::close(writer);
    std::string all(old_bytes.size(), '\0');
    const ssize_t n = ::pread(reader, all.data(), all.size(), 0);
    seen.push_back(std::to_string(n) + (n == static_cast<ssize_t>(new_bytes.size()) && all.substr(0, n) == new_bytes ? " new" : " other"));
    struct stat st {};
    ::fstat(reader, &st);
    seen.push_back(std::to_string(st.st_size));
    ::close(reader);
    auto [err, again] = read_all(root / neff);
    seen.push_back(std::to_string(err) + (again == new_bytes ? " new" : " other"));
    return seen;
  };
  const std::string on_disk = put_done_entry(plain.path(), lnl, "written", old_bytes);
  const std::string neff = put_done_entry(m.backing(), lnl, "written", old_bytes);
  // A hit passes through, without a READ.
  const uint64_t opens = m.daemon().stats()["passthrough"]["opens"];
  const uint64_t reads = reads_between(m, [&] { CHECK(read_all(m.mnt() / neff).second == old_bytes); });
  if (passthrough) {
    CHECK(reads == 0);
    CHECK(m.daemon().stats()["passthrough"]["opens"] == opens + 1);
  }
  const auto expected = steps(plain.path(), on_disk);
  CHECK(expected == std::vector<std::string>{"4096oooooooo", fmt::format("{} new", new_bytes.size()),
                                             std::to_string(new_bytes.size()), "0 new"});
  CHECK(steps(m.mnt(), neff) == expected);
  CHECK(test::slurp(m.backing() / neff) == new_bytes);

  // A twin (our twins are hard links): written through one name, the other entry keeps
  // its bytes, and the name written reads the new ones.
  const std::string first = put_done_entry(m.backing(), lnl, "twin a", old_bytes);
  const std::string second = put_done_entry(m.backing(), lnl, "twin b", "");
  fs::remove(m.backing() / second);
  fs::create_hard_link(m.backing() / first, m.backing() / second);
  CHECK(read_all(m.mnt() / second).second == old_bytes);  // the kernel knows both names
  CHECK(read_all(m.mnt() / first).second == old_bytes);
  int writer = ::open((m.mnt() / first).c_str(), O_WRONLY | O_TRUNC);
  REQUIRE(writer >= 0);
  CHECK(::write(writer, new_bytes.data(), new_bytes.size()) == static_cast<ssize_t>(new_bytes.size()));
  ::close(writer);
  CHECK(read_all(m.mnt() / first).second == new_bytes);
  CHECK(read_all(m.mnt() / second).second == old_bytes);
  CHECK(test::slurp(m.backing() / second) == old_bytes);
  CHECK(fs::hard_link_count(m.backing() / second) == 1);
  // A truncate by name too.
  const std::string third = put_done_entry(m.backing(), lnl, "twin c", "");
  fs::remove(m.backing() / third);
  fs::create_hard_link(m.backing() / second, m.backing() / third);
  CHECK(read_all(m.mnt() / third).second == old_bytes);
  CHECK(::truncate((m.mnt() / second).c_str(), 10) == 0);
  CHECK(read_all(m.mnt() / second).second == old_bytes.substr(0, 10));
  CHECK(read_all(m.mnt() / third).second == old_bytes);
}

TEST_CASE("with --no-passthrough every read of a done NEFF goes through the daemon", "[fuse]") {
  Mount m({}, {"--no-passthrough"});
  auto e = m.entry("rocm08_normal_9.hlo_proto.pb", "nopt+0");
  const fs::path neff = m.mnt() / e / "model.neff";
  const std::string bytes = read_all(neff).second;
  CHECK(reads_between(m, [&] { CHECK(read_all(neff).second == bytes); }) > 0);
  auto s = m.daemon().stats();
  CHECK(s["passthrough"]["on"] == false);
  CHECK(s["passthrough"]["why_off"] == "--no-passthrough");
  CHECK(s["passthrough"]["opens"] == 0);
  // A reader with O_DIRECT: the daemon opens the backing file with it too, and reads into
  // a buffer aligned for it.
  {
    int fd = ::open(neff.c_str(), O_RDONLY | O_DIRECT);
    REQUIRE(fd >= 0);
    std::unique_ptr<char, decltype(&std::free)> at(static_cast<char*>(std::aligned_alloc(4096, 1 << 16)), &std::free);
    const ssize_t n = ::pread(fd, at.get(), 1 << 16, 0);
    ::close(fd);
    REQUIRE(n == static_cast<ssize_t>(std::min<std::size_t>(bytes.size(), 1 << 16)));
    CHECK(std::string(at.get(), static_cast<std::size_t>(n)) == bytes.substr(0, static_cast<std::size_t>(n)));
  }
  // The kernel reads ahead as far as INIT asks (1 MiB), not its own 128 KiB: a cold hit
  // makes 8 times fewer READs. (Root only may set it.)
  if (::geteuid() == 0) {
    struct stat st {};
    REQUIRE(::stat(m.mnt().c_str(), &st) == 0);
    CHECK(test::slurp(fmt::format("/sys/class/bdi/{}:{}/read_ahead_kb", major(st.st_dev), minor(st.st_dev))) == "1024\n");
  }
}
