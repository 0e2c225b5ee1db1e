// LNL's protocol as its ranks run it, checked with a client written apart from ours
// (tests/support/lnl_client.py, from the facts in ../shared/notes/lnl-cache-facts.md and
// with the libraries LNL uses): each scenario runs on a plain folder and through the mount,
// and must end alike (exit codes, compiles, NEFF bytes).
#include <csignal>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include <nlohmann/json.hpp>

#include <neffcache/cache/layout.hpp>

#include "fuse_test.hpp"
#include "lnl.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

namespace {

const std::string k_graph = "spu_credit_fraud_test.hlo.pb";

struct Rank {
  int exit = 0;          // exit status, or -signal
  std::string outcome;   // hit, waited, fetched, compiled; empty after a FATAL
  std::string neff_sha;  // of the NEFF it loaded
  std::string saved;     // after save_cache(): promoted, taken
};

// One rank of the independent client on the cache `root`; `compiles` counts its compiler
// runs; `seconds`: how long each compile takes.
// `remote`: NEURON_LIBTORCH_REMOTE_CACHE, with save_cache() after a compile. Each rank is a
// process group of its own (setsid), so that kill_rank takes its compiler with it.
std::unique_ptr<test::Child> start_rank(const fs::path& root, const std::string& key, const fs::path& compiles,
                                        double seconds, const std::optional<fs::path>& remote = std::nullopt,
                                        std::vector<std::string> extra = {}) {
  std::vector<std::string> argv{"setsid", "env", "NEFFCACHE_FAKE_LOG=" + compiles.string(), "NEFFCACHE_FAKE_RATE=0",
                                fmt::format("NEFFCACHE_FAKE_SECONDS={}", seconds), "/usr/bin/python3",
                                test::path::lnl_client, root.string(), key, (test::k_corpus / k_graph).string(),
                                test::path::fake_compiler, "--arg=-O1", "--poll", "0.1"};
  if (remote) argv.insert(argv.end(), {"--remote", remote->string(), "--save-cache"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  return std::make_unique<test::Child>(argv, true);
}

Rank finish(test::Child& c) {
  Rank r;
  const std::string out = c.rest();
  r.exit = c.wait();
  if (auto j = nlohmann::json::parse(out, nullptr, false); j.is_object()) {
    r.outcome = j.value("outcome", "");
    r.neff_sha = j.value("neff_sha256", "");
    r.saved = j.value("saved", "");
  }
  return r;
}

// `n` ranks at once.
std::vector<Rank> ranks(const fs::path& root, const std::string& key, int n, const fs::path& compiles) {
  std::vector<std::unique_ptr<test::Child>> started;
  for (int i = 0; i < n; ++i) started.push_back(start_rank(root, key, compiles, 0.5));
  std::vector<Rank> out;
  for (auto& c : started) out.push_back(finish(*c));
  return out;
}

std::map<std::string, int> outcomes(const std::vector<Rank>& rs) {
  std::map<std::string, int> m;
  for (const auto& r : rs) ++m[r.outcome];
  return m;
}

// Kills a rank and the compiler it runs (its process group), as a node's OOM killer or a
// lost host would.
void kill_rank(test::Child& c) { ::kill(-c.pid(), SIGKILL); }

// Waits (up to a minute: sanitizer builds are slow) until `path` exists.
bool appears(const fs::path& path) {
  for (int i = 0; i < 12000 && !fs::exists(path); ++i) std::this_thread::sleep_for(5ms);
  return fs::exists(path);
}

struct Scenario {
  std::vector<Rank> first, second;
  int compiles_after_first = 0, compiles_after_second = 0;
};

Scenario fresh_key_then_hits(const fs::path& root, const std::string& key, const fs::path& compiles) {
  Scenario s;
  s.first = ranks(root, key, 4, compiles);
  s.compiles_after_first = test::count_lines(compiles);
  s.second = ranks(root, key, 4, compiles);
  s.compiles_after_second = test::count_lines(compiles);
  return s;
}

}  // namespace

TEST_CASE("LNL ranks on a fresh key, then again: one compile, one NEFF, on a folder as through the mount",
          "[fuse][lnl][conformance]") {
  const std::string key = test::lnl_key("conformance: fresh key");
  test::TempDir plain;
  const Scenario disk = fresh_key_then_hits(plain / "cache", key, plain / "compiles.log");
  Mount m;
  const Scenario mount = fresh_key_then_hits(m.mnt(), key, m.backing().parent_path() / "client-compiles.log");
  for (const auto* s : {&disk, &mount}) {
    for (const auto& r : s->first) CHECK(r.exit == 0);
    for (const auto& r : s->second) CHECK(r.exit == 0);
    CHECK(s->compiles_after_first == 1);
    CHECK(s->compiles_after_second == 1);
    CHECK(outcomes(s->first)["compiled"] == 1);
    CHECK(outcomes(s->second)["hit"] == 4);
  }
  // The same NEFF everywhere, the daemon compiling nothing of the ranks'.
  const std::string neff_sha = disk.first.front().neff_sha;
  CHECK_FALSE(neff_sha.empty());
  for (const auto* s : {&disk, &mount})
    for (const auto* run : {&s->first, &s->second})
      for (const auto& r : *run) CHECK(r.neff_sha == neff_sha);
  CHECK(m.compiles() == 0);
  // Through the mount the ranks' files are in the backing folder, as they wrote them.
  for (const char* f : {"graph.hlo", "command.txt", ".artifact_metadata_v0.json", "log-neuron-cc.txt",
                        ".compilation_complete", ".cache_accessed"})
    CHECK(fs::exists(m.backing() / key / f));
  CHECK(fs::exists(test::lnl_lock(m.backing(), key)));
  CHECK_FALSE(fs::exists(own_files((m.backing() / key).string()).failure));
}

TEST_CASE("an LNL rank killed while it compiles: its waiter clears its files and stops, a retry compiles, "
          "on a folder as through the mount", "[fuse][lnl][conformance]") {
  const std::string key = test::lnl_key("conformance: holder killed");
  auto scenario = [&](const fs::path& root, const fs::path& compiles) {
    auto holder = start_rank(root, key, compiles, 30);
    REQUIRE(appears(compiles));  // its compiler runs (the fake logs each compile as it starts)
    const fs::path waiting = compiles.parent_path() / "waiting";
    auto waiter = start_rank(root, key, compiles, 0.2, std::nullopt, {"--waiting-file", waiting.string()});
    REQUIRE(appears(waiting));  // it waits: the holder lives
    kill_rank(*holder);
    std::vector<Rank> out{finish(*holder), finish(*waiter)};
    out.push_back(finish(*start_rank(root, key, compiles, 0.2)));
    return out;
  };
  test::TempDir plain;
  const auto disk = scenario(plain / "cache", plain / "compiles.log");
  Mount m;
  const auto mount = scenario(m.mnt(), m.backing().parent_path() / "client-compiles.log");
  for (const auto* s : {&disk, &mount}) {
    CHECK((*s)[0].exit == -SIGKILL);
    CHECK((*s)[1].exit == 1);  // "Lock holder process died - cache invalidated, please retry compilation"
    CHECK((*s)[2].exit == 0);
    CHECK((*s)[2].outcome == "compiled");
  }
  CHECK(mount[2].neff_sha == disk[2].neff_sha);
  CHECK(m.compiles() == 0);
}

TEST_CASE("an LNL rank that finds a dead holder of a pending entry removes the marker the mount shows",
          "[fuse][lnl][conformance]") {
  // A rank wrote the metadata and died before the marker: a job the daemon may compile,
  // whose placeholders a rank's step 3 removes (unlink after exists()).
  Mount m;
  const std::string key = test::lnl_key("conformance: dead holder");
  test::make_lnl_entry(m.backing(), k_graph, key);
  test::spit(test::lnl_holder(m.backing(), key), "pid:999999999\nprocess_name:python3\ncmdline:['python3']\ntimestamp:1\n");
  const auto marker = m.mnt() / key / ".compilation_complete";
  REQUIRE(fs::exists(marker));
  CHECK(::unlink(marker.c_str()) == 0);
  // The next rank finds the entry complete through the mount (the daemon compiles it on
  // the NEFF's open) and loads one NEFF.
  auto r = finish(*start_rank(m.mnt(), key, m.backing().parent_path() / "client-compiles.log", 0.2));
  CHECK(r.exit == 0);
  CHECK(r.outcome == "hit");
  CHECK(m.compiles() == 1);
}

TEST_CASE("an LNL rank that arrives while the daemon compiles its key finds the lock held by a live holder, "
          "and loads the daemon's NEFF", "[fuse][lnl][conformance]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=2"});
  const std::string key = test::lnl_key("conformance: daemon compiles");
  test::make_lnl_entry(m.backing(), k_graph, key);
  std::thread opener([&] { (void)read_all(m.mnt() / key / lnl_neff_name(key)); });
  const auto holder = test::lnl_holder(m.backing(), key);
  REQUIRE(appears(holder));
  // The daemon holds the key's lock, through the mount too, and names itself as LNL reads
  // a holder: the independent client judges it alive (its step 3 leaves it alone).
  int fd = ::open(test::lnl_lock(m.mnt(), key).c_str(), O_RDWR);
  REQUIRE(fd >= 0);
  CHECK(::flock(fd, LOCK_EX | LOCK_NB) != 0);
  ::close(fd);
  auto judged = test::run({"/usr/bin/python3", "-c",
                           "import sys, psutil; f = dict(l.split(':', 1) for l in open(sys.argv[1]).read().splitlines()); "
                           "p = psutil.Process(int(f['pid'])); "
                           "sys.exit(0 if p.name() == f['process_name'] and str(p.cmdline()) == f['cmdline'] else 3)",
                           holder.string()});
  CHECK(judged.exit_code == 0);
  auto r = finish(*start_rank(m.mnt(), key, m.backing().parent_path() / "client-compiles.log", 0.2));
  opener.join();
  CHECK(r.exit == 0);
  CHECK(test::count_lines(m.backing().parent_path() / "client-compiles.log") == 0);
  CHECK(m.compiles() == 1);
  CHECK(fs::exists(test::lnl_lock(m.backing(), key)));
}

TEST_CASE("save_cache() into a remote cache, a fresh node fetching it, two nodes promoting one key at once: "
          "alike with a plain folder and with the mount as the remote", "[fuse][lnl][conformance]") {
  const std::string key = test::lnl_key("conformance: save_cache"), raced = test::lnl_key("conformance: race");
  auto scenario = [&](const fs::path& nodes, const fs::path& remote) {
    const fs::path compiles = nodes / "compiles.log";
    std::vector<Rank> out{finish(*start_rank(nodes / "node1", key, compiles, 0.2, remote)),
                          finish(*start_rank(nodes / "node2", key, compiles, 0.2, remote))};
    // (Compiles long enough that both start before either has promoted.)
    auto n3 = start_rank(nodes / "node3", raced, compiles, 3, remote);
    auto n4 = start_rank(nodes / "node4", raced, compiles, 3, remote);
    out.push_back(finish(*n3));
    out.push_back(finish(*n4));
    return std::pair(out, test::count_lines(compiles));
  };
  test::TempDir plain;
  fs::create_directories(plain / "remote");
  const auto [disk, disk_compiles] = scenario(plain / "nodes", plain / "remote");
  Mount m;
  test::TempDir nodes;
  const auto [mount, mount_compiles] = scenario(nodes.path(), m.mnt());
  for (const auto* s : {&disk, &mount}) {
    for (const auto& r : *s) CHECK(r.exit == 0);
    CHECK((*s)[0].outcome == "compiled");
    CHECK((*s)[0].saved == "promoted");
    CHECK((*s)[1].outcome == "fetched");
    CHECK((*s)[1].neff_sha == (*s)[0].neff_sha);
    // Both racing nodes compile (nodes do not coordinate); one promotion wins.
    CHECK((*s)[2].outcome == "compiled");
    CHECK((*s)[3].outcome == "compiled");
    std::multiset<std::string> saved{(*s)[2].saved, (*s)[3].saved};
    CHECK(saved == std::multiset<std::string>{"promoted", "taken"});
  }
  CHECK(disk_compiles == 3);
  CHECK(mount_compiles == 3);
  // A node whose local cache is the mount fetches from the remote over a leftover folder
  // of the key (no metadata: a dead rank's): copied into <key>.tmp.<pid>, the leftover
  // renamed to <key>.trash.<pid> and removed, the copy renamed into place.
  Mount local;
  fs::create_directories(local.backing() / key);
  fs::copy_file(test::k_corpus / k_graph, local.backing() / key / "graph.hlo");
  const auto fetched = finish(*start_rank(local.mnt(), key, nodes / "compiles.log", 0.2, plain / "remote"));
  CHECK(fetched.exit == 0);
  CHECK(fetched.outcome == "fetched");
  CHECK(fetched.neff_sha == disk[0].neff_sha);
  CHECK(local.compiles() == 0);
  for (const auto& e : fs::directory_iterator(local.backing())) {
    const std::string name = e.path().filename().string();
    CHECK_FALSE((name.starts_with(key + ".tmp.") || name.starts_with(key + ".trash.")));
  }
  CHECK(mount[0].neff_sha == disk[0].neff_sha);
  CHECK(m.compiles() == 0);
  // The remote holds the two keys, whole, and no staging folder.
  for (const fs::path& remote : {plain / "remote", m.backing()}) {
    std::set<std::string> names;
    for (const auto& e : fs::directory_iterator(remote))
      if (!e.path().filename().string().starts_with(".")) names.insert(e.path().filename().string());
    CHECK(names == std::set<std::string>{key, raced});
    for (const auto& k : {key, raced}) CHECK(fs::exists(remote / k / ".compilation_complete"));
  }
}
