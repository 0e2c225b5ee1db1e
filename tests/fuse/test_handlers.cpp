// The daemon's handlers (fuse/fs.hpp) called as lowlevel.cpp calls them, without a mount:
// a caller of this process whose kept requests are recorded (test_caller.hpp). What a
// client sees through a real mount is tested in the other files here; these pin what
// the handlers answer, including the answers that come later.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch_test_macros.hpp>

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <neffcache/cache/layers.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/store/directory.hpp>

#include "fs.hpp"
#include "lnl.hpp"
#include "support.hpp"
#include "test_caller.hpp"

namespace fs = std::filesystem;
using namespace neffcachefs;
using neffcache::detail::UniqueFd;

namespace {

// A Filesystem over a temporary cache, started, with the fake compiler.
struct Unmounted {
  test::TempDir d;
  Options opts;
  std::unique_ptr<Filesystem> fs;
  without_mount::TestCaller caller;

  // `lower`: a read-only layer under the cache (layers.hpp); `set`: more options.
  explicit Unmounted(bool lower = false, const std::function<void(Options&)>& set = {}) {
    opts.backing = (d / "cache").string();
    fs::create_directories(opts.backing);
    if (lower) {
      opts.lowers = {(d / "lower").string()};
      fs::create_directories(opts.lowers[0]);
    }
    opts.store = neffcache::store::DirectoryStore::open(opts.backing);
    opts.scheduler.jobs = 1;
    opts.scheduler.settings.compiler = neffcache::CompilerTemplate::parse(test::k_fake_template).value();
    opts.scheduler.settings.content_index = false;
    opts.scheduler.settled = neffcache::folder_settled;
    opts.compiler_dir = test::k_fake_dir;
    opts.eager = false;
    if (set) set(opts);
  }
  ~Unmounted() {
    if (fs) fs->shutdown();
  }
  Filesystem& start() {
    fs = std::make_unique<Filesystem>(opts);
    fs->start();
    return *fs;
  }
  // Looks `rel` up from the root one name at a time, as the kernel walks a path.
  Answer<fuse_entry_param> walk(const std::string& rel) {
    fuse_ino_t at = FUSE_ROOT_ID;
    Answer<fuse_entry_param> e = Errno{ENOENT};
    for (const auto& part : fs::path(rel)) {
      e = fs->lookup(at, part.c_str());
      if (!e.ok()) return e;
      at = e.value().ino;
    }
    return e;
  }
  fuse_ino_t ino(const std::string& rel) {
    auto e = walk(rel);
    REQUIRE(e.ok());
    return e.value().ino;
  }
  // The names a listing of folder `rel` shows (without . and ..).
  std::vector<std::string> names(const std::string& rel) {
    std::vector<std::string> out;
    const int err = fs->readdir(rel.empty() ? FUSE_ROOT_ID : ino(rel), 0, false,
                                [&](const std::string& name, const fuse_entry_param&, off_t, bool) {
                                  if (name != "." && name != "..") out.push_back(name);
                                  return true;
                                });
    CHECK(err == 0);
    std::sort(out.begin(), out.end());
    return out;
  }
  Answer<fuse_file_info> open(fuse_ino_t ino, int flags) {
    fuse_file_info fi{};
    fi.flags = flags;
    return fs->open(caller, ino, fi);
  }
  nlohmann::json stats() { return nlohmann::json::parse(fs->stats_json()); }
};

std::string read_all(int fd) {
  std::string out(1 << 16, '\0');
  const ssize_t n = ::pread(fd, out.data(), out.size(), 0);
  REQUIRE(n >= 0);
  out.resize(static_cast<std::size_t>(n));
  return out;
}

const std::string k_pending = test::k_fake_dir + "/MODULE_1+abc";
const std::string k_done = test::k_fake_dir + "/MODULE_2+abc";

}  // namespace

TEST_CASE("handlers: lookups find a pending entry's placeholders and listings show its files alone; a leftover "
          "NEFF shows no marker; a done entry's files are kept a day and opening its NEFF is a hit, in both dialects",
          "[fuse-unit][handlers]") {
  Unmounted m;
  const fs::path cache = m.opts.backing;
  test::spit(cache / k_pending / "model.hlo_module.pb", test::slurp(test::corpus_files()[0]));
  test::spit(cache / k_done / "model.hlo_module.pb", "x");
  test::spit(cache / k_done / "model.neff", "NEFF");
  test::spit(cache / k_done / "model.done", "");
  test::spit(cache / "neuronxcc-9.9.9/MODULE_3+abc/model.hlo_module.pb", "x");
  const std::string leftover = test::k_fake_dir + "/MODULE_4+abc";
  test::spit(cache / leftover / "model.hlo_module.pb", "x");
  test::spit(cache / leftover / "model.neff", "NEFF!");
  const std::string key = test::lnl_key("handlers-done");
  const auto lnl = test::make_lnl_entry(cache, test::corpus_files()[0].filename().string(), key);
  test::spit(lnl / neffcache::lnl_neff_name(key), "LNL NEFF");
  test::spit(lnl / ".compilation_complete", neffcache::lnl_marker(1, 8));
  m.start();

  auto placeholder = m.walk(k_pending + "/model.neff");
  REQUIRE(placeholder.ok());
  // The attributes the NEFF will have (the daemon's umask), the HLO's owner and time; size 0.
  const mode_t mask = ::umask(0);
  ::umask(mask);
  struct stat hlo {};
  REQUIRE(::stat((cache / k_pending / "model.hlo_module.pb").c_str(), &hlo) == 0);
  CHECK(placeholder.value().attr.st_mode == (S_IFREG | (0644 & ~mask)));
  CHECK(placeholder.value().attr.st_uid == hlo.st_uid);
  CHECK(placeholder.value().attr.st_mtime == hlo.st_mtime);
  CHECK(placeholder.value().attr.st_size == 0);
  CHECK(placeholder.value().entry_timeout == 0);
  CHECK(m.walk(k_pending + "/model.done").ok());
  // Never listed: a walker gets the folder's answers and starts no compile.
  CHECK(m.names(k_pending) == std::vector<std::string>{"model.hlo_module.pb"});
  // Beside a leftover NEFF no marker shows: a client that looks for model.done sees a miss.
  CHECK(m.walk(leftover + "/model.done").error() == ENOENT);
  CHECK(m.names(leftover) == std::vector<std::string>{"model.hlo_module.pb", "model.neff"});
  // Unlinked, it removes nothing and stays, as long as the entry is pending.
  CHECK(m.fs->unlink(m.ino(k_pending), "model.neff", false) == 0);
  CHECK(m.walk(k_pending + "/model.neff").ok());
  CHECK_FALSE(fs::exists(cache / k_pending / "model.neff"));
  // Another compiler's entry shows nothing of ours.
  CHECK(m.walk("neuronxcc-9.9.9/MODULE_3+abc/model.neff").error() == ENOENT);
  CHECK(m.names("neuronxcc-9.9.9/MODULE_3+abc") == std::vector<std::string>{"model.hlo_module.pb"});

  auto neff = m.walk(k_done + "/model.neff");
  REQUIRE(neff.ok());
  CHECK(neff.value().attr.st_size == 4);
  CHECK(neff.value().attr_timeout == 86400);
  CHECK(m.walk(test::k_fake_dir).value().attr_timeout == 1);
  auto opened = m.open(neff.value().ino, O_RDONLY);
  REQUIRE(opened.ok());
  UniqueFd fd(static_cast<int>(opened.value().fh));
  CHECK(opened.value().keep_cache);
  CHECK(opened.value().noflush);
  CHECK_FALSE(opened.value().direct_io);
  CHECK(read_all(fd.get()) == "NEFF");
  CHECK(m.stats()["hits"] == 1);
  // An LNL hit counts too, and names its entry (what a warm start fetches). Its NEFF is
  // kept, but neither the folder nor its other files: a rank writes into a done entry,
  // and may remove its marker.
  auto lnl_neff = m.walk(key + "/" + neffcache::lnl_neff_name(key));
  REQUIRE(lnl_neff.ok());
  CHECK(lnl_neff.value().attr_timeout == 86400);
  CHECK(m.walk(key).value().attr_timeout == 1);
  CHECK(m.walk(key + "/.compilation_complete").value().attr_timeout == 1);
  CHECK(m.walk(key + "/graph.hlo").value().attr_timeout == 1);
  auto lnl_opened = m.open(lnl_neff.value().ino, O_RDONLY);
  REQUIRE(lnl_opened.ok());
  UniqueFd lnl_fd(static_cast<int>(lnl_opened.value().fh));
  CHECK(lnl_opened.value().keep_cache);
  CHECK(m.stats()["hits"] == 2);
  CHECK(m.stats()["opened"].dump().find(key) != std::string::npos);

  // The mount's own counters: never kept, read-only, read through direct I/O.
  auto counters = m.walk(".neffcache/stats.json");
  REQUIRE(counters.ok());
  CHECK(counters.value().attr_timeout == 0);
  CHECK(m.open(counters.value().ino, O_RDWR).error() == EACCES);
  auto snapshot = m.open(counters.value().ino, O_RDONLY);
  REQUIRE(snapshot.ok());
  CHECK(snapshot.value().direct_io);
  CHECK(m.fs->release(m.caller, counters.value().ino, snapshot.value()) == 0);
  CHECK(m.walk(".neffcache/other").error() == ENOENT);
  CHECK(m.fs->lookup(FUSE_ROOT_ID, "..").error() == EINVAL);
  CHECK(m.names("") == std::vector<std::string>{key, "neuronxcc-2.21.0", "neuronxcc-9.9.9"});
}

TEST_CASE("handlers: the open of a placeholder is kept and answered with the compiled NEFF; one whose entry "
          "failed since its lookup answers EIO at once",
          "[fuse-unit][handlers]") {
  Unmounted m;
  const fs::path cache = m.opts.backing;
  const std::string failing = test::k_fake_dir + "/MODULE_4+abc";
  test::spit(cache / k_pending / "model.hlo_module.pb", test::slurp(test::corpus_files()[0]));
  test::spit(cache / failing / "model.hlo_module.pb", test::slurp(test::corpus_files()[1]));
  m.start();

  const fuse_ino_t placeholder = m.ino(k_pending + "/model.neff");
  CHECK(m.open(placeholder, O_RDWR).error() == EACCES);
  const int misses = m.stats()["misses"];
  auto open = m.open(placeholder, O_RDONLY);
  REQUIRE(open.deferred());
  auto answered = m.caller.kept();
  REQUIRE(answered);
  REQUIRE(answered->wait());
  REQUIRE(answered->opened);
  UniqueFd fd(static_cast<int>(answered->opened->fh));
  CHECK(answered->opened->direct_io);  // the kernel knew a zero-size stand-in
  CHECK(read_all(fd.get()) == test::slurp(cache / k_pending / "model.neff"));
  CHECK(fs::exists(cache / k_pending / "model.done"));
  CHECK(m.stats()["misses"] == misses + 1);

  // Looked up while pending; a failure is recorded before the open (another host, a tool).
  const fuse_ino_t other = m.ino(failing + "/model.neff");
  test::spit(cache / failing / "model.log", "error: injected");
  CHECK(m.open(other, O_RDONLY).error() == EIO);
  CHECK(m.caller.kept() == answered);  // nothing kept
  CHECK(m.stats()["eio"]["03"] == 1);
  m.fs->shutdown();  // (every waiter answered: none twice)
  CHECK(answered->answers == 1);
}

TEST_CASE("handlers: over a lower layer, a removed name leaves a whiteout, is made again over it, and only what "
          "layer 0 alone has moves",
          "[fuse-unit][handlers][layers]") {
  Unmounted m(/*lower=*/true);
  const fs::path cache = m.opts.backing, lower = m.opts.lowers[0];
  test::spit(lower / "b.txt", "lower b");
  test::spit(lower / "c.txt", "lower c");
  test::spit(lower / "notes/a.txt", "lower a");
  m.start();
  const std::string wh_b = neffcache::whiteout_of("b.txt");

  CHECK(m.names("") == std::vector<std::string>{"b.txt", "c.txt", "notes"});
  REQUIRE(m.walk("b.txt").ok());
  CHECK(m.fs->unlink(FUSE_ROOT_ID, "b.txt", false) == 0);
  CHECK(fs::exists(cache / wh_b));
  CHECK(fs::exists(lower / "b.txt"));  // nothing of a lower layer is written
  CHECK(m.walk("b.txt").error() == ENOENT);
  CHECK(m.names("") == std::vector<std::string>{"c.txt", "notes"});
  // Made again: the whiteout goes, and the new file is layer 0's.
  fuse_file_info fi{};
  fi.flags = O_WRONLY | O_CREAT;
  auto made = m.fs->create(m.caller, FUSE_ROOT_ID, "b.txt", 0644, fi);
  REQUIRE(made.ok());
  UniqueFd(static_cast<int>(made.value().fi.fh)).reset();
  CHECK_FALSE(fs::exists(cache / wh_b));
  CHECK(fs::exists(cache / "b.txt"));
  // The layers' own names are not the clients'.
  CHECK(m.fs->create(m.caller, FUSE_ROOT_ID, wh_b.c_str(), 0644, fi).error() == EPERM);

  // Written: copied up first, the lower file unchanged.
  auto c = m.open(m.ino("c.txt"), O_WRONLY);
  REQUIRE(c.ok());
  UniqueFd cfd(static_cast<int>(c.value().fh));
  CHECK(::pwrite(cfd.get(), "upper", 5, 0) == 5);
  CHECK(test::slurp(cache / "c.txt").starts_with("upper"));
  CHECK(test::slurp(lower / "c.txt") == "lower c");

  // What a lower layer has moves only by a copy (mv does it on EXDEV).
  CHECK(m.fs->rename(FUSE_ROOT_ID, "notes", FUSE_ROOT_ID, "notes2", 0) == EXDEV);
  CHECK(m.fs->link(m.ino("notes/a.txt"), FUSE_ROOT_ID, "a2").error() == EXDEV);
  CHECK(m.fs->link(m.ino("notes/a.txt"), FUSE_ROOT_ID, "c.txt").error() == EXDEV);  // (before its EEXIST)
  CHECK(m.fs->link(m.ino("b.txt"), FUSE_ROOT_ID, "c.txt").error() == EEXIST);
  CHECK(m.fs->link(m.ino("b.txt"), FUSE_ROOT_ID, "notes").error() == EEXIST);  // a lower layer's
  CHECK(m.fs->mknod_like(m.caller, FUSE_ROOT_ID, "b.txt", S_IFREG | 0644, nullptr).error() == EEXIST);
  CHECK(m.fs->link(m.ino("b.txt"), FUSE_ROOT_ID, wh_b.c_str()).error() == EPERM);
  auto linked = m.fs->link(m.ino("b.txt"), FUSE_ROOT_ID, "b-link.txt");
  REQUIRE(linked.ok());
  CHECK(linked.value().attr.st_nlink == 2);
  CHECK(m.fs->unlink(FUSE_ROOT_ID, "b-link.txt", false) == 0);
  CHECK(m.fs->rename(FUSE_ROOT_ID, "b.txt", FUSE_ROOT_ID, "b2.txt", 0) == 0);
  CHECK(m.names("") == std::vector<std::string>{"b2.txt", "c.txt", "notes"});

  // A folder removed and made again hides what the layer below has in it.
  CHECK(m.fs->unlink(FUSE_ROOT_ID, "notes", true) == ENOTEMPTY);
  CHECK(m.fs->unlink(m.ino("notes"), "a.txt", false) == 0);
  CHECK(m.fs->unlink(FUSE_ROOT_ID, "notes", true) == 0);
  CHECK(m.walk("notes").error() == ENOENT);
  test::spit(lower / "notes/late.txt", "");  // a name the whiteout hides too
  REQUIRE(m.fs->mknod_like(m.caller, FUSE_ROOT_ID, "notes", S_IFDIR | 0755, nullptr).ok());
  CHECK(m.names("notes").empty());
}

TEST_CASE("handlers: over a read-only cache without an upper layer, a miss is refused and only lock files are made",
          "[fuse-unit][handlers][layers]") {
  Unmounted m(/*lower=*/true, [](Options& o) {
    o.scratch = true;
    o.scheduler.settings.compiles_off = "the cache is read-only and the mount has no --upper";
  });
  const fs::path lower = m.opts.lowers[0];
  test::spit(lower / k_pending / "model.hlo_module.pb", "x");
  m.start();
  const fuse_ino_t placeholder = m.ino(k_pending + "/model.neff");
  CHECK(m.open(placeholder, O_RDONLY).error() == EIO);
  CHECK(m.caller.kept() == nullptr);
  CHECK(m.stats()["refused"] == 1);
  fuse_file_info fi{};
  fi.flags = O_WRONLY | O_CREAT;
  CHECK(m.fs->create(m.caller, FUSE_ROOT_ID, "x.txt", 0644, fi).error() == EROFS);
  auto lock = m.fs->create(m.caller, FUSE_ROOT_ID, "lock", 0644, fi);
  REQUIRE(lock.ok());
  UniqueFd(static_cast<int>(lock.value().fi.fh)).reset();
  CHECK(fs::exists(fs::path(m.opts.backing) / "lock"));
  CHECK_FALSE(fs::exists(lower / "lock"));
}

TEST_CASE("handlers: passthrough's rule per inode: one backing file while readers pass through, no mix with cached "
          "opens, writers with them, a failed registration served by the daemon",
          "[handlers]") {
  Passthrough pt;
  fuse_conn_info conn{};
  CHECK(pt.negotiate(&conn, false) == "--no-passthrough");
  if constexpr (!k_libfuse_has_passthrough) {
    CHECK(pt.negotiate(&conn, true).find("libfuse") != std::string::npos);
    CHECK(!pt.on());
    return;
  }
  CHECK(pt.negotiate(&conn, true).find("kernel") != std::string::npos);  // it did not offer it
#ifdef FUSE_CAP_PASSTHROUGH
  conn.capable |= FUSE_CAP_PASSTHROUGH;
  if (::geteuid() != 0) {
    CHECK(pt.negotiate(&conn, true).find("root") != std::string::npos);
    return;
  }
  REQUIRE(pt.negotiate(&conn, true).empty());
  CHECK(pt.on());
  CHECK((conn.want & FUSE_CAP_PASSTHROUGH) != 0);
#endif
  without_mount::TestCaller caller;
  auto& backings = caller.backings();
  Inode done;
  // Returns the errno and the backing id of an open of `done` (`lower`: a file of a
  // read-only lower layer).
  auto open = [&](int flags, bool eligible, bool lower = false) {
    fuse_file_info fi{};
    fi.flags = flags;
    fi.fh = 42;
    const int e = opens_to_write(flags) ? pt.writer_opening(done, fi)
                                        : (pt.reader_opening(caller, done, fi, eligible, lower), 0);
    return std::pair{e, backing_of(fi)};
  };
  // Readers of a finished file share one backing file, registered once.
  CHECK(open(O_RDONLY, true) == std::pair{0, 1});
  CHECK(open(O_RDONLY, true) == std::pair{0, 1});
  // Any other open of it must pass through too (the kernel refuses a mix)...
  CHECK(open(O_RDONLY, false) == std::pair{0, 1});
  // ...writers too (the kernel opens theirs from it with their flags).
  CHECK(open(O_RDWR, true) == std::pair{0, 1});
  CHECK(open(O_RDONLY | O_TRUNC, false) == std::pair{0, 1});
  CHECK(pt.opens == 5);
  CHECK(pt.writers == 2);
  for (int k = 0; k < 4; ++k) pt.ended(caller, done);
  CHECK(backings.closed.empty());
  pt.ended(caller, done);  // the last: its backing file is given back
  CHECK(backings.closed == std::vector<int>{1});
  CHECK((done.backing_opens == 0 && done.backing_id == 0));
  // A writer first: readers go through the daemon until it ends.
  CHECK(open(O_RDWR, false) == std::pair{0, 0});
  CHECK(open(O_RDONLY, true) == std::pair{0, 0});
  CHECK(pt.busy == 1);
  pt.ended(caller, done);
  pt.ended(caller, done);
  CHECK(done.cached_opens == 0);
  CHECK(open(O_RDONLY, true) == std::pair{0, 2});
  pt.ended(caller, done);
  CHECK(backings.closed == std::vector<int>{1, 2});
  // Readers of a read-only lower layer's file: a writer would write it behind its copy up.
  CHECK(open(O_RDONLY, true, true) == std::pair{0, 3});
  CHECK(open(O_WRONLY, false).first == ETXTBSY);
  pt.ended(caller, done);
  CHECK(backings.closed == std::vector<int>{1, 2, 3});
  // A writer whose open then fails is taken back.
  CHECK(open(O_WRONLY, false) == std::pair{0, 0});
  pt.not_answered(done);
  CHECK(done.cached_opens == 0);
  // The kernel refuses to register it: served by the daemon, counted; refused with EPERM
  // (not CAP_SYS_ADMIN where it counts), it is not tried again.
  backings.refuse = true;
  CHECK(open(O_RDONLY, true) == std::pair{0, 0});
  CHECK(pt.fallbacks == 1);
  CHECK(done.cached_opens == 1);
  pt.ended(caller, done);
  CHECK(done.cached_opens == 0);
  CHECK(backings.closed.size() == 3);
  CHECK(pt.on());
  backings.refuse_with = EPERM;
  CHECK(open(O_RDONLY, true) == std::pair{0, 0});
  CHECK(!pt.on());
  CHECK(pt.why_off().find("EPERM") != std::string::npos);
  CHECK(open(O_RDONLY, true) == std::pair{0, 0});
  CHECK(pt.fallbacks == 2);  // not tried the second time
  pt.ended(caller, done);
  pt.ended(caller, done);
  CHECK(done.cached_opens == 0);
}

TEST_CASE("handlers: with passthrough, a writer of a file that readers pass through passes through with them, and "
          "the file is not finished while it lasts",
          "[handlers]") {
  if (!k_libfuse_has_passthrough || ::geteuid() != 0) SKIP("needs a libfuse with passthrough, and root");
  Unmounted m;
  const fs::path cache = m.opts.backing;
  test::spit(cache / k_done / "model.hlo_module.pb", "x");
  test::spit(cache / k_done / "model.neff", "NEFF");
  test::spit(cache / k_done / "model.done", "");
  m.start();
#ifdef FUSE_CAP_PASSTHROUGH
  fuse_conn_info conn{};
  conn.capable |= FUSE_CAP_PASSTHROUGH;
  m.fs->init(&conn);
#endif
  const fuse_ino_t neff = m.ino(k_done + "/model.neff");
  Inode& inode = *reinterpret_cast<Inode*>(neff);
  CHECK(inode.finished);
  auto reader = m.open(neff, O_RDONLY);
  REQUIRE(reader.ok());
  CHECK(backing_of(reader.value()) == 1);
  CHECK_FALSE(reader.value().keep_cache);  // (the kernel fails a passthrough open that asks for it)
  auto writer = m.open(neff, O_WRONLY | O_TRUNC);
  REQUIRE(writer.ok());
  CHECK(backing_of(writer.value()) == 1);
  CHECK(fs::file_size(cache / k_done / "model.neff") == 0);
  CHECK(!inode.finished);
  CHECK(m.ino(k_done + "/model.neff") == neff);  // a lookup meanwhile keeps it so
  CHECK(!inode.finished);
  CHECK(m.fs->release(m.caller, neff, writer.value()) == 0);
  CHECK(m.fs->release(m.caller, neff, reader.value()) == 0);
  CHECK(m.caller.backings().closed == std::vector<int>{1});
  CHECK(m.stats()["passthrough"]["opens"] == 2);
  CHECK(m.stats()["passthrough"]["writers"] == 1);
  // Done still, and written by no one: the next lookup finds it finished again.
  m.ino(k_done + "/model.neff");
  CHECK(inode.finished);
}

TEST_CASE("handlers: a create whose answer does not reach the kernel gives back the kernel's reference it counted",
          "[fuse-unit][handlers]") {
  Unmounted m;
  test::spit(fs::path(m.opts.backing) / "a.txt", "a");
  m.start();
  // Looked up first, so that the inode outlives the create's reference.
  const fuse_ino_t ino = m.ino("a.txt");
  const Inode& inode = *reinterpret_cast<const Inode*>(ino);
  REQUIRE(inode.nlookup == 1);
  fuse_file_info fi{};
  fi.flags = O_WRONLY | O_CREAT;
  auto made = m.fs->create(m.caller, FUSE_ROOT_ID, "a.txt", 0644, fi);
  REQUIRE(made.ok());
  REQUIRE(made.value().entry.ino == ino);
  CHECK(inode.nlookup == 2);
  m.fs->not_created(made.value());  // as lowlevel.cpp does when fuse_reply_create fails
  CHECK(inode.nlookup == 1);
  m.fs->forget(ino, 1);
}
