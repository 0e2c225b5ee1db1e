// Caches that must not compile or cannot be written, on real mounts: --no-compile
// refuses a miss at once and still serves hits and known equal graphs.
#include "fuse_test.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

TEST_CASE("mounted with --no-compile, a miss fails at once with EIO and a counted, logged refusal; hits and twins are served",
          "[fuse][layers]") {
  test::TempDir shared;
  const fs::path backing = shared.path() / "cache";
  std::string done;
  {
    Mount m({}, {}, backing);
    done = m.entry("rocm08_normal_9.hlo_proto.pb", "done+0");
    REQUIRE(read_all(m.mnt() / done / "model.neff").first == 0);
    REQUIRE(m.compiles() == 1);
  }
  Mount m({"NEFFCACHE_FAKE_SECONDS=5"}, {"--no-compile"}, backing);
  auto miss = m.entry("gopjrt_tuple.hlo.pb", "miss+0");
  const auto before = test::snapshot_tree(m.backing() / miss);
  auto start = std::chrono::steady_clock::now();
  CHECK(reader_process(m.mnt() / miss / "model.neff")->wait() == 5);  // EIO
  // Not after the 5 s compile it refuses. (A reader's start under ASan beside three other
  // tests took 1.6 s once: the bound leaves room for that.)
  CHECK(std::chrono::steady_clock::now() - start < 3s);
  CHECK(m.compiles() == 0);
  CHECK(test::snapshot_tree(m.backing() / miss) == before);  // no log, no lock, no failure record
  auto j = nlohmann::json::parse(read_all(m.mnt() / ".neffcache" / "stats.json").second);
  CHECK(j["refused"] == 1);
  CHECK(j["eio"]["07"] == 1);
  // Refused, not recorded: the entry still shows what opening it would produce.
  CHECK(fs::exists(m.mnt() / miss / "model.neff"));
  // A hit, and an entry of the same graph under another name (the content index), are served.
  CHECK(reader_process(m.mnt() / done / "model.neff")->wait() == 0);
  auto twin = m.entry("rocm08_normal_9.hlo_proto.pb", "twin+0");
  CHECK(reader_process(m.mnt() / twin / "model.neff")->wait() == 0);
  CHECK(test::slurp(m.backing() / twin / "model.neff") == test::slurp(m.backing() / done / "model.neff"));
  CHECK(m.compiles() == 0);
}

namespace {

// `from` bound read-only at `at` for the scope (a read-only volume, as a shipped cache
// comes); lazily unmounted at the end. Needs root, as the CI machines give.
class ReadOnlyBind {
 public:
  ReadOnlyBind(const fs::path& from, const fs::path& at) : at_(at) {
    fs::create_directories(at);
    REQUIRE(::mount(from.c_str(), at.c_str(), nullptr, MS_BIND, nullptr) == 0);
    REQUIRE(::mount(nullptr, at.c_str(), nullptr, MS_REMOUNT | MS_BIND | MS_RDONLY, nullptr) == 0);
  }
  ~ReadOnlyBind() { ::umount2(at_.c_str(), MNT_DETACH); }
  ReadOnlyBind(const ReadOnlyBind&) = delete;
  ReadOnlyBind& operator=(const ReadOnlyBind&) = delete;

 private:
  fs::path at_;
};

// The errno of a call that returns -1 on failure (0 when it worked).
int errno_of(int rc) { return rc == 0 || rc > 0 ? 0 : errno; }

const std::vector<std::string> k_two_graphs{"gopjrt_tuple.hlo.pb", "rocm08_normal_9.hlo_proto.pb"};

// A cache that the simulated client compiled `graphs` into (its own keys, as a client
// on another machine leaves them; `client_env`: NAME=value words for it), plus a pending
// entry of another graph; the pending entry's path below the root.
std::string make_shipped_cache(const fs::path& cache, const fs::path& log, const std::vector<std::string>& graphs,
                               const std::vector<std::string>& client_env = {}) {
  fs::create_directories(cache);
  auto made = test::run(client_sim(cache, log, client_env, graphs));
  REQUIRE(made.exit_code == 0);
  REQUIRE(sim_summary(made.output)["compiled"] == graphs.size());
  const std::string pending = "neuronxcc-2.21.0/MODULE_pending+0";
  fs::create_directories(cache / pending);
  fs::copy_file(test::k_corpus / "spu_tf_jit_comp.hlo.pb", cache / pending / "model.hlo_module.pb");
  return pending;
}

// The entry folders (neuronxcc-*/MODULE_*) the mount lists.
std::set<std::string> listed_entries(const fs::path& mnt) {
  std::set<std::string> out;
  for (const auto& c : fs::directory_iterator(mnt))
    if (c.path().filename().string().starts_with("neuronxcc-"))
      for (const auto& e : fs::directory_iterator(c.path()))
        out.insert((c.path().filename() / e.path().filename()).string());
  return out;
}

// A cache shipped on a read-only volume: make_shipped_cache of k_two_graphs in dir/cache,
// bound read-only at dir/ro; its pending entry's path, and its tree as it came.
// The tests name its members through a structured binding; a lambda names them through the
// object (clang before 16 cannot capture a structured binding).
struct ShippedReadOnly {
  test::TempDir dir;
  const std::string pending = make_shipped_cache(dir / "cache", dir / "made.log", k_two_graphs);
  ReadOnlyBind ro{dir / "cache", dir / "ro"};
  const std::map<std::string, std::string> before = test::snapshot_tree(dir / "ro");
};

}  // namespace

TEST_CASE("a read-only cache: a client that locks <root>/lock reads its hits; a miss fails at once; nothing is written",
          "[fuse][layers]") {
  ShippedReadOnly shipped_ro;
  auto& [dir, pending, ro, before] = shipped_ro;

  // Without the mount, the client stops at the cache's lock file, as libneuronxla does.
  auto direct = test::run(client_sim(dir / "ro", dir / "direct.log", {}, k_two_graphs));
  CHECK(direct.exit_code != 0);
  CHECK(direct.output.find("[Errno 30] Read-only file system") != std::string::npos);

  Mount m({"NEFFCACHE_FAKE_SECONDS=5"}, {}, dir / "ro");
  // Training through the mount: both graphs are hits, under the cache's lock.
  auto train = test::run(client_sim(m.mnt(), dir / "train.log", {}, k_two_graphs));
  INFO(train.output);
  CHECK(train.exit_code == 0);
  CHECK(sim_summary(train.output)["hits"] == 2);
  CHECK(test::count_lines(dir / "train.log") == 0);
  // The lock file lives as long as the mount, and locks on it work between processes.
  int held = ::open((m.mnt() / "lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(held >= 0);
  REQUIRE(::flock(held, LOCK_EX) == 0);
  CHECK(test::run({"flock", "-n", (m.mnt() / "lock").string(), "-c", "true"}).exit_code == 1);
  ::close(held);
  CHECK(test::run({"flock", "-n", (m.mnt() / "lock").string(), "-c", "true"}).exit_code == 0);
  // A miss fails at once: nothing may compile where nothing may be written.
  auto start = std::chrono::steady_clock::now();
  CHECK(reader_process(m.mnt() / pending / "model.neff")->wait() == 5);  // EIO
  CHECK(std::chrono::steady_clock::now() - start < 3s);  // (room for a loaded sanitizer build)
  CHECK(m.compiles() == 0);
  auto stats = m.daemon().stats();
  CHECK(stats["eio"]["07"] == 1);
  CHECK(stats["read_only"] == true);
  // Writes that would change the cache answer EROFS, as the read-only disk would.
  const std::string done = *listed_entries(m.mnt()).begin();
  CHECK(errno_of(::mkdir((m.mnt() / "neuronxcc-2.21.0" / "MODULE_new+0").c_str(), 0755)) == EROFS);
  CHECK(errno_of(::open((m.mnt() / done / "model.neff").c_str(), O_WRONLY | O_CLOEXEC)) == EROFS);
  CHECK(errno_of(::unlink((m.mnt() / done / "model.done").c_str())) == EROFS);
  CHECK(errno_of(::rename((m.mnt() / done).c_str(), (m.mnt() / "moved").c_str())) == EROFS);
  CHECK(errno_of(::truncate((m.mnt() / done / "model.neff").c_str(), 0)) == EROFS);
  CHECK(errno_of(::open((m.mnt() / "notes.txt").c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) == EROFS);
  CHECK(errno_of(::chmod((m.mnt() / done / "model.neff").c_str(), 0600)) == EROFS);
  CHECK(errno_of(::chmod(m.mnt().c_str(), 0700)) == EROFS);
  // The mount's root shows the cache's own mode.
  CHECK((fs::status(m.mnt()).permissions() & fs::perms::all) == (fs::status(dir / "ro").permissions() & fs::perms::all));
  // An entry's lock file may be made and removed, as a client waiting on it would.
  int entry_lock = ::open((m.mnt() / done / "model.hlo_module.pb.lock").c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  CHECK(entry_lock >= 0);
  ::close(entry_lock);
  CHECK(::unlink((m.mnt() / done / "model.hlo_module.pb.lock").c_str()) == 0);
  CHECK(reader_process(m.mnt() / done / "model.neff")->wait() == 0);
  // The read-only cache is as it was: not a byte, not a lock file more.
  CHECK(test::snapshot_tree(dir / "ro") == before);
}

TEST_CASE("with --upper, a pending entry of the read-only cache and a new entry compile into the upper folder; the lower stays as it was",
          "[fuse][layers]") {
  ShippedReadOnly shipped_ro;
  auto& [dir, pending, ro, before] = shipped_ro;
  const auto shipped = listed_entries(dir / "ro");
  fs::create_directories(dir / "upper");
  Mount m({}, {"--upper", (dir / "upper").string()}, dir / "ro");

  // The listing merges the layers.
  CHECK(listed_entries(m.mnt()) == shipped);
  // The pending entry of the lower layer compiles, once, into the upper one.
  CHECK(reader_process(m.mnt() / pending / "model.neff")->wait() == 0);
  CHECK(m.compiles() == 1);
  CHECK(fs::exists(dir / "upper" / pending / "model.done"));
  CHECK(test::slurp(dir / "upper" / pending / "model.hlo_module.pb") ==
        test::slurp(test::k_corpus / "spu_tf_jit_comp.hlo.pb"));
  // A new entry written through the mount goes to the upper layer and compiles there.
  const std::string fresh = "neuronxcc-2.21.0/MODULE_fresh+0";
  REQUIRE(fs::create_directory(m.mnt() / fresh));
  fs::copy_file(test::k_corpus / "gopjrt_x_squared.hlo.pb", m.mnt() / fresh / "model.hlo_module.pb");
  CHECK(reader_process(m.mnt() / fresh / "model.neff")->wait() == 0);
  CHECK(m.compiles() == 2);
  CHECK(fs::exists(dir / "upper" / fresh / "model.neff"));
  // The shipped hits are read from the lower layer: no compile, no copy.
  for (const auto& e : shipped)
    if (e != pending) CHECK(reader_process(m.mnt() / e / "model.neff")->wait() == 0);
  CHECK(m.compiles() == 2);
  // The simulated client trains on all of it: hits, under the cache's lock (made in the upper layer).
  auto train = test::run(client_sim(m.mnt(), dir / "train.log", {}, k_two_graphs));
  INFO(train.output);
  CHECK(train.exit_code == 0);
  CHECK(sim_summary(train.output)["hits"] == 2);
  CHECK(fs::exists(dir / "upper" / "lock"));
  // A change to a file of a lower entry writes the upper layer's copy of the whole entry.
  std::vector<std::string> done;
  std::copy_if(shipped.begin(), shipped.end(), std::back_inserter(done),
               [&](auto& e) { return e != shipped_ro.pending; });
  REQUIRE(done.size() == 2);
  test::spit(m.mnt() / done[0] / "notes.txt", "mine");
  CHECK(test::slurp(dir / "upper" / done[0] / "notes.txt") == "mine");
  CHECK(test::slurp(dir / "upper" / done[0] / "model.neff") == test::slurp(dir / "ro" / done[0] / "model.neff"));
  CHECK(reader_process(m.mnt() / done[0] / "model.neff")->wait() == 0);
  CHECK(m.compiles() == 2);
  // A rename of a lower entry is refused as across file systems (mv copies then); one
  // in the upper layer moves.
  const fs::path moved = m.mnt() / fs::path(done[1]).parent_path() / "MODULE_moved+0";
  CHECK(errno_of(::rename((m.mnt() / done[1]).c_str(), moved.c_str())) == EXDEV);
  CHECK(errno_of(::rename((m.mnt() / done[0]).c_str(), moved.c_str())) == 0);
  CHECK(fs::exists(dir / "upper" / moved.lexically_relative(m.mnt()) / "notes.txt"));
  CHECK(test::snapshot_tree(dir / "ro") == before);
}

TEST_CASE("with --upper, removing an entry of the read-only cache hides it with a whiteout, also after a restart",
          "[fuse][layers]") {
  test::TempDir dir;
  // The shipped entries in a compiler folder of their own, without the pending one.
  const std::string pending = make_shipped_cache(dir / "cache", dir / "made.log", k_two_graphs,
                                                 {"NEFFCACHE_FAKE_VERSION=2.21.0.0+fake"});
  const auto before = test::snapshot_tree(dir / "cache");
  const auto shipped = listed_entries(dir / "cache");
  fs::create_directories(dir / "upper");
  std::string gone;
  for (const auto& e : shipped)
    if (e != pending) gone = e;
  const fs::path compiler_dir = fs::path(gone).parent_path();
  {
    // (A lower layer need not be read-only for the mount to leave it alone.)
    Mount m({}, {"--upper", (dir / "upper").string()}, dir / "cache");
    fs::remove_all(m.mnt() / gone);
    CHECK_FALSE(fs::exists(m.mnt() / gone));
    CHECK_FALSE(listed_entries(m.mnt()).contains(gone));
    CHECK(errno_of(::rmdir((m.mnt() / gone).c_str())) == ENOENT);
    // The whiteout is ours, in the upper layer, and never shown.
    CHECK(fs::exists(dir / "upper" / fs::path(gone).parent_path() / (".neffcache-wh." + fs::path(gone).filename().string())));
    for (const auto& f : fs::directory_iterator(m.mnt() / fs::path(gone).parent_path()))
      CHECK_FALSE(f.path().filename().string().starts_with(".neffcache"));
  }
  {
    Mount m({}, {"--upper", (dir / "upper").string()}, dir / "cache");
    CHECK_FALSE(fs::exists(m.mnt() / gone));
    CHECK(listed_entries(m.mnt()).size() == shipped.size() - 1);
    // The name made again is a new entry: nothing of the hidden one shows through.
    REQUIRE(fs::create_directory(m.mnt() / gone));
    CHECK(fs::is_empty(m.mnt() / gone));
    // A whole compiler folder removed and made again is empty too.
    fs::remove_all(m.mnt() / compiler_dir);
    CHECK_FALSE(fs::exists(m.mnt() / compiler_dir));
    REQUIRE(fs::create_directory(m.mnt() / compiler_dir));
    CHECK(fs::is_empty(m.mnt() / compiler_dir));
    CHECK(fs::exists(m.mnt() / pending));  // (another compiler folder)
  }
  CHECK(test::snapshot_tree(dir / "cache") == before);
}

TEST_CASE("with --upper, the content index looks through every layer: a twin of a shipped graph is served, not compiled",
          "[fuse][layers]") {
  test::TempDir dir;
  make_shipped_cache(dir / "cache", dir / "made.log", k_two_graphs);
  // A cache compiled by the client alone: it has no index of ours.
  REQUIRE_FALSE(fs::exists(dir / "cache" / ".neffcache"));
  const auto shipped = listed_entries(dir / "cache");
  ReadOnlyBind ro(dir / "cache", dir / "ro");
  fs::create_directories(dir / "upper");
  Mount m({}, {"--upper", (dir / "upper").string()}, dir / "ro");
  // The start-up scan reads the lower layer's entries into the upper layer's index.
  for (int i = 0; i < 200 && m.daemon().stats()["index"]["scan"] != "done"; ++i) std::this_thread::sleep_for(25ms);
  REQUIRE(m.daemon().stats()["index"]["scan"] == "done");
  // The same graph under another name, written through the mount.
  std::string original;
  for (const auto& e : shipped)
    if (fs::exists(dir / "ro" / e / "model.neff") &&
        test::slurp(dir / "ro" / e / "model.hlo_module.pb") == test::slurp(test::k_corpus / "gopjrt_tuple.hlo.pb"))
      original = e;
  REQUIRE_FALSE(original.empty());
  const std::string twin = (fs::path(original).parent_path() / "MODULE_twin+0").string();
  REQUIRE(fs::create_directory(m.mnt() / twin));
  fs::copy_file(dir / "ro" / original / "compile_flags.json", m.mnt() / twin / "compile_flags.json");
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", m.mnt() / twin / "model.hlo_module.pb");
  CHECK(reader_process(m.mnt() / twin / "model.neff")->wait() == 0);
  CHECK(m.compiles() == 0);
  // The graph's write through the mount started the entry's background job, which may
  // have served the twin before the reader asked: the reader can see the NEFF a moment
  // before the job is counted.
  for (int i = 0; i < 200 && m.daemon().stats()["twins"]["served"] != 1; ++i) std::this_thread::sleep_for(25ms);
  CHECK(m.daemon().stats()["twins"]["served"] == 1);
  CHECK(test::slurp(dir / "upper" / twin / "model.neff") == test::slurp(dir / "ro" / original / "model.neff"));
}

TEST_CASE("with --upper, renames over layers answer as a disk would, and never bring a removed lower name back",
          "[fuse][layers]") {
  test::TempDir dir;
  const std::string pending = make_shipped_cache(dir / "cache", dir / "made.log", k_two_graphs);
  const std::string key(32, 'c');  // an LNL entry the lower cache has
  test::spit(dir / "cache" / key / "graph.hlo", "x");
  test::spit(dir / "cache" / "notes.txt", "shipped");
  const auto before = test::snapshot_tree(dir / "cache");
  const fs::path compilers = fs::path(pending).parent_path();
  fs::create_directories(dir / "upper");
  Mount m({}, {"--upper", (dir / "upper").string()}, dir / "cache");
  auto rename = [&](const fs::path& a, const fs::path& b) { return errno_of(::rename((m.mnt() / a).c_str(), (m.mnt() / b).c_str())); };
  // A folder whose names are in a lower layer moves as across file systems (mv copies).
  CHECK(rename(compilers, "moved") == EXDEV);
  // LNL's save_cache(): a staging folder renamed onto a key a layer has is refused as on a disk.
  REQUIRE(fs::create_directory(m.mnt() / "staging"));
  test::spit(m.mnt() / "staging" / "graph.hlo", "y");
  CHECK(rename("staging", key) == ENOTEMPTY);
  CHECK(test::slurp(m.mnt() / key / "graph.hlo") == "x");
  // A file of the upper layer replaces a lower one.
  test::spit(m.mnt() / "new.txt", "mine");
  CHECK(rename("new.txt", "notes.txt") == 0);
  CHECK(test::slurp(m.mnt() / "notes.txt") == "mine");
  CHECK_FALSE(fs::exists(m.mnt() / "new.txt"));
  // A folder removed, then another renamed to its name: nothing of the removed one shows.
  // (rm -rf: a pending entry's placeholders are no files to remove, ENOENT.)
  REQUIRE(test::run({"rm", "-rf", (m.mnt() / compilers).string()}).exit_code == 0);
  REQUIRE_FALSE(fs::exists(m.mnt() / compilers));
  REQUIRE(fs::create_directory(m.mnt() / "t"));
  test::spit(m.mnt() / "t" / "x", "x");
  CHECK(rename("t", compilers) == 0);
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(m.mnt() / compilers)) names.insert(e.path().filename().string());
  CHECK(names == std::set<std::string>{"x"});
  // A folder of the upper layer alone moves, and takes its whiteouts along.
  CHECK(rename(compilers, "elsewhere") == 0);
  CHECK_FALSE(fs::exists(m.mnt() / compilers));
  CHECK(fs::exists(m.mnt() / "elsewhere" / "x"));
  CHECK(test::snapshot_tree(dir / "cache") == before);
}

TEST_CASE("a read-only cache with a writable --lower: a pending entry is refused without a write, even with a twin below",
          "[fuse][layers]") {
  test::TempDir dir;
  // The lower cache is writable and indexed: a done entry and a pending twin of it.
  const fs::path lower = dir / "lower";
  std::string done;
  {
    Mount m({}, {}, lower);
    done = m.entry("rocm08_normal_9.hlo_proto.pb", "done+0");
    REQUIRE(reader_process(m.mnt() / done / "model.neff")->wait() == 0);
  }
  const std::string twin = "neuronxcc-2.21.0/MODULE_twin+0";
  fs::create_directories(lower / twin);
  fs::copy_file(test::k_corpus / "rocm08_normal_9.hlo_proto.pb", lower / twin / "model.hlo_module.pb");
  const auto before = test::snapshot_tree(lower);
  fs::create_directories(dir / "cache");
  ReadOnlyBind ro(dir / "cache", dir / "ro");
  Mount m({}, {"--lower", lower.string()}, dir / "ro");
  auto start = std::chrono::steady_clock::now();
  CHECK(reader_process(m.mnt() / twin / "model.neff")->wait() == 5);  // EIO
  CHECK(std::chrono::steady_clock::now() - start < 3s);  // (room for a loaded sanitizer build)
  CHECK(m.daemon().stats()["eio"]["07"] == 1);
  CHECK(reader_process(m.mnt() / done / "model.neff")->wait() == 0);
  CHECK(m.compiles() == 0);
  CHECK(test::snapshot_tree(lower) == before);
}

TEST_CASE("neffcache commands on a read-only cache and on layers: reads see every layer, changes act on the top or refuse in one line",
          "[fuse][layers][cli]") {
  ShippedReadOnly shipped_ro;
  auto& [dir, pending, ro, before] = shipped_ro;
  auto ls = [](const fs::path& cache) {
    auto r = test::run_tool({"ls", "--cache", cache.string(), "--json"});
    REQUIRE(r.exit_code == 0);
    std::map<std::string, nlohmann::json> by_path;
    for (const auto& e : nlohmann::json::parse(r.output)) by_path[e["path"]] = e;
    return by_path;
  };
  // The read-only folder itself: reads work; changes are refused at once.
  CHECK(ls(dir / "ro").size() == 3);
  CHECK(test::run_tool({"verify", "--cache", (dir / "ro").string()}).exit_code == 0);
  for (std::vector<std::string> change : {std::vector<std::string>{"gc", "--max-size", "0"}, {"clear-neffs"}, {"clean"},
                                          {"retry", "--all"}, {"index"}}) {
    change.insert(change.end(), {"--cache", (dir / "ro").string()});
    test::check_one_line_error(test::run_tool(change), "is read-only");
  }
  {
    // Mounted without --upper: every entry is in the read-only layer.
    Mount m({}, {}, dir / "ro");
    auto listed = ls(m.mnt());
    REQUIRE(listed.size() == 3);
    for (const auto& [path, e] : listed) CHECK(e["layer"] == 1);
    CHECK(listed[pending]["state"] == "pending");
    auto stats = nlohmann::json::parse(test::run_tool({"stats", "--cache", m.mnt().string(), "--json"}).output);
    CHECK(stats["states"]["done"] == 2);
    CHECK(test::run_tool({"verify", "--cache", m.mnt().string()}).output.find("2 checked, 0 broken") == 0);
    test::check_one_line_error(test::run_tool({"gc", "--cache", m.mnt().string(), "--max-size", "0"}),
                               "serves a read-only cache");
  }
  fs::create_directories(dir / "upper");
  Mount m({}, {"--upper", (dir / "upper").string()}, dir / "ro");
  REQUIRE(reader_process(m.mnt() / pending / "model.neff")->wait() == 0);  // compiled into the upper layer
  auto listed = ls(m.mnt());
  REQUIRE(listed.size() == 3);
  CHECK(listed[pending]["state"] == "done");
  CHECK_FALSE(listed[pending].contains("layer"));  // layer 0
  auto scan = nlohmann::json::parse(test::run_tool({"scan", "--cache", m.mnt().string(), "--json"}).output);
  CHECK(scan["remaining"] == 0);
  // explain finds a shipped graph's entry through the layers.
  std::string shipped;
  for (const auto& [path, e] : listed)
    if (path != pending) shipped = path;
  auto explained = test::run_tool({"explain", "--cache", m.mnt().string(), "--json", (m.mnt() / shipped).string()});
  REQUIRE(explained.exit_code == 0);
  CHECK(nlohmann::json::parse(explained.output)["verdict"] == "hit");
  // analyze reads every layer's graphs.
  REQUIRE(test::run_tool({"analyze", "--cache", m.mnt().string(), "--output", (dir / "analysis").string()}).exit_code == 0);
  const std::string analysis = test::slurp(dir / "analysis" / "result.json");
  for (const auto& [path, e] : listed) CHECK(analysis.find(path) != std::string::npos);
  // Changes act on the upper layer; the shipped entries are left as they are, and said so.
  auto cleared = test::run_tool({"clear-neffs", "--cache", m.mnt().string()});
  CHECK(cleared.exit_code == 0);
  CHECK(cleared.output.find("2 entries of read-only layers left as they are") != std::string::npos);
  CHECK(cleared.output.find("1 entries are pending again") != std::string::npos);
  CHECK_FALSE(fs::exists(dir / "upper" / pending / "model.neff"));
  // Naming an entry of a read-only layer is refused in one line.
  auto one = test::run_tool({"retry", "--cache", m.mnt().string(), (m.mnt() / shipped).string()});
  CHECK(one.output.find("in the read-only layer " + (dir / "ro").string()) != std::string::npos);
  CHECK(std::count(one.output.begin(), one.output.end(), '\n') <= 2);
  CHECK(test::snapshot_tree(dir / "ro") == before);
}
