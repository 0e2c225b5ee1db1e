// torch-xla ranks on two hosts whose daemons mount one bucket, with no shim: the ranks are
// the conformance suite's client (tests/conformance/neuron_client.py, written from the
// notes' facts), which takes an entry's lock itself and polls another's until it is gone.
// Another host's lease on an entry shows on this host as the entry's lock file, and a
// client's create of its lock takes the lease first (store/remote.hpp), so that a rank that
// looked before the other host's graph was up still waits for that host's NEFF.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/detail/process.hpp>
#include <neffcache/s3/lease.hpp>

#include "s3_mount.hpp"
#include "s3_support.hpp"
#include "support.hpp"

namespace fs = std::filesystem;
using namespace std::chrono_literals;

namespace {

// The compiles of every host and rank go to one log; each takes long enough for the
// ranks of both hosts to meet on it.
const std::vector<std::string> k_compile_env{"NEFFCACHE_FAKE_SECONDS=0.4", "NEFFCACHE_FAKE_IDLE=1"};

// Two hosts over one fresh bucket. `apart`: each daemon and its ranks in PID, UTS and mount
// namespaces of their own, a host name each (S3Mount::enter), both mounted at one path, as
// on hosts; else both are processes of this machine, at two paths, as the tests that make
// system calls from here need (a caller outside a daemon's PID namespace has no pid it
// could watch, nor a mount of another namespace to call).
struct Hosts {
  explicit Hosts(std::string_view what, bool apart, std::vector<std::string> extra = {})
      : s3(test::fresh_bucket(what)),
        log(dir / "compiles.log"),
        a(url(), log, extra, k_compile_env, test::BucketAs::cache, {}, apart ? "host-a" : "", at(apart)),
        b(url(), log, extra, k_compile_env, test::BucketAs::cache, {}, apart ? "host-b" : "", at(apart)) {}
  fs::path at(bool apart) const { return apart ? dir / "neuron-compile-cache" : fs::path(); }
  std::string url() const { return fmt::format("s3://{}", s3->bucket()); }

  std::unique_ptr<neffcache::S3Client> s3;
  test::TempDir dir;
  const fs::path log;
  test::S3Mount a, b;
};

std::string rel_of(int g) { return test::fake_entry(g, 9100); }

// Runs `argv` as a process of `host` (in a host apart's namespaces): whether it exited 0.
bool run_on(const test::S3Mount& host, const std::vector<std::string>& argv) {
  auto words = host.enter();
  words.insert(words.end(), argv.begin(), argv.end());
  return test::run(words).exit_code == 0;
}
bool exists_on(const test::S3Mount& host, const fs::path& p) { return run_on(host, {"test", "-e", p.string()}); }

// The inputs of graph `g` (a corpus graph and its flags), in a folder of their own that a
// rank copies into the entry once the entry's lock is its own.
fs::path inputs_of(const test::TempDir& dir, int g) {
  const fs::path in = dir / fmt::format("inputs-{}", g);
  fs::create_directories(in);
  test::spit(in / "model.hlo_module.pb", test::slurp(test::corpus_files()[static_cast<std::size_t>(g)]));
  test::spit(in / "compile_flags.json", R"(["--target=trn1","-O1"])");
  return in;
}

// A rank of `host` on graph `g` (`more`: more of the client's options).
// `env`: more of its environment.
std::vector<std::string> rank_argv(const test::S3Mount& host, int g, const fs::path& inputs, const std::string& lock,
                                   const fs::path& log, const std::vector<std::string>& more = {},
                                   const std::vector<std::string>& env = {}) {
  const fs::path mnt = host.mnt();
  std::vector<std::string> argv = host.enter();
  argv.push_back("env");
  // (A sanitizer build's leak check stops the world through /proc, which in a host apart is
  // this machine's and names other thread ids: it would abort the fake compiler.)
  for (auto& w : test::s3_env_words({"NEFFCACHE_FAKE_LOG=" + log.string(), "NEFFCACHE_FAKE_SECONDS=0.4",
                                     "NEFFCACHE_FAKE_RATE=0", "ASAN_OPTIONS=detect_leaks=0"}))
    argv.push_back(w);
  argv.insert(argv.end(), env.begin(), env.end());
  argv.insert(argv.end(), {"/usr/bin/python3", test::path::neuron_client, mnt.string(), rel_of(g), "--compiler",
                           test::path::fake_compiler, "--lock", lock, "--poll", "0.1", "--inputs-from",
                           inputs.string()});
  argv.insert(argv.end(), more.begin(), more.end());
  return argv;
}

// A rank's JSON line in its output, or an error.
nlohmann::json result_of(const std::string& out) {
  const auto at = out.rfind("\n{", out.size() > 1 ? out.size() - 2 : 0);
  auto j = nlohmann::json::parse(at == std::string::npos ? out : out.substr(at + 1), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return {{"outcome", "error"}, {"message", out}};
  return j;
}

// One rank's run of `host` on graph `g`: its JSON line, or its error.
nlohmann::json rank_run(const test::S3Mount& host, int g, const fs::path& inputs, const std::string& lock,
                        const fs::path& log) {
  auto r = neffcache::detail::run_capture(rank_argv(host, g, inputs, lock, log), std::chrono::seconds(120));
  if (!r) return {{"outcome", "error"}, {"message", r.error().message}};
  return result_of(r->output);
}

// Ranks per host on each of `graphs` new graphs, all started at once, each rank taking
// the graphs in order. Their results, by graph.
std::map<int, std::vector<nlohmann::json>> run_ranks(Hosts& h, int per_host, int graphs, const std::string& lock) {
  std::vector<fs::path> inputs;
  for (int g = 0; g < graphs; ++g) inputs.push_back(inputs_of(h.dir, g));
  std::vector<std::vector<nlohmann::json>> per_rank(static_cast<std::size_t>(2 * per_host));
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2 * per_host; ++r)
    ranks.emplace_back([&, r] {
      const test::S3Mount& host = r < per_host ? h.a : h.b;
      for (int g = 0; g < graphs; ++g)
        per_rank[static_cast<std::size_t>(r)].push_back(rank_run(host, g, inputs[static_cast<std::size_t>(g)], lock, h.log));
    });
  for (auto& t : ranks) t.join();
  std::map<int, std::vector<nlohmann::json>> by_graph;
  for (const auto& results : per_rank)
    for (int g = 0; g < graphs; ++g) by_graph[g].push_back(results[static_cast<std::size_t>(g)]);
  return by_graph;
}

}  // namespace

TEST_CASE("ranks on two hosts that take entry locks with O_EXCL compile each new graph once", "[s3][mount][hosts]") {
  Hosts h("hosts-excl", true);
  constexpr int k_graphs = 10;
  auto results = run_ranks(h, 2, k_graphs, "excl");
  for (const auto& [g, ranks] : results) {
    INFO("graph " << g);
    int compiled = 0;
    for (const auto& r : ranks) {
      INFO(r.dump());
      CHECK(r["outcome"] != "error");
      compiled += r["outcome"] == "compiled";
      // Every rank holds the one NEFF the winner made.
      CHECK(r.value("neff_sha256", nlohmann::json()) == ranks.front().value("neff_sha256", nlohmann::json()));
    }
    CHECK(compiled == 1);
    if (compiled != 1)
      for (const auto& r : ranks) fmt::print(stderr, "graph {}: {}\n", g, r.dump());
  }
  CHECK(test::count_lines(h.log) == k_graphs);
}

TEST_CASE("ranks on two hosts that look, then create their lock never fail; second compiles stay local",
          "[s3][mount][hosts]") {
  Hosts h("hosts-look", true);
  constexpr int k_graphs = 10;
  auto results = run_ranks(h, 2, k_graphs, "look");
  int failed = 0;
  for (const auto& [g, ranks] : results)
    for (const auto& r : ranks)
      if (r["outcome"] == "error") {
        ++failed;
        UNSCOPED_INFO("graph " << g << ": " << r.dump());
      }
  CHECK(failed == 0);
  const int compiles = static_cast<int>(test::count_lines(h.log));
  CHECK(compiles >= k_graphs);
  // A look that raced another host's create compiles again; how often is reported, not
  // judged (the lock's create is not exclusive, as on a disk).
  WARN(fmt::format("look-then-create: {} second compiles of {} graphs on 2 hosts x 2 ranks", compiles - k_graphs,
                   k_graphs));
  // The bucket holds one NEFF per graph, the first one published.
  for (int g = 0; g < k_graphs; ++g) CHECK(h.s3->head(rel_of(g) + "/model.done").has_value());
}

TEST_CASE("another host's live lease shows as the entry's lock file; its unlink removes nothing remote",
          "[s3][mount][hosts]") {
  Hosts h("hosts-shown", false);
  const std::string rel = rel_of(0);
  const std::string key = rel + "/model.hlo_module.pb.lock";
  // Host B's rank made the entry folder and found it unlocked.
  const fs::path entry_b = h.b.mnt() / rel;
  fs::create_directories(entry_b);
  const fs::path lock_b = entry_b / "model.hlo_module.pb.lock";
  CHECK_FALSE(fs::exists(lock_b));

  // Another host (a third, by name) takes the entry's lease.
  auto lease = neffcache::S3Lease::acquire(*h.s3, key, 30s, "host-c");
  REQUIRE(lease.has_value());
  CHECK(fs::exists(lock_b));
  CHECK(fs::is_regular_file(lock_b));
  CHECK(fs::file_size(lock_b) == 0);
  // Listed as a folder shared by the hosts would list it (clear-locks globs *.lock).
  bool listed = false;
  for (const auto& e : fs::directory_iterator(entry_b)) listed = listed || e.path().filename() == lock_b.filename();
  CHECK(listed);
  // An exclusive create answers as a disk does for a name that exists.
  errno = 0;
  CHECK(::open(lock_b.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666) == -1);
  CHECK(errno == EEXIST);
  // Its unlink succeeds and leaves the lease; the name shows again while the lease lives.
  CHECK(::unlink(lock_b.c_str()) == 0);
  CHECK(h.s3->head(key).has_value());
  CHECK(fs::exists(lock_b));

  // The lease given back: the name goes at once (no reuse of an earlier look at S3).
  REQUIRE(lease->release().has_value());
  CHECK_FALSE(fs::exists(lock_b));
  // Now a client's exclusive create takes the entry's lease for it: host C waits.
  int fd = ::open(lock_b.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666);
  CHECK(fd >= 0);
  if (fd >= 0) ::close(fd);
  auto c = neffcache::S3Lease::acquire(*h.s3, key, 30s, "host-c");
  CHECK_FALSE(c.has_value());
  // Host A shows the client's hold as a lock too.
  fs::create_directories(h.a.mnt() / rel);
  CHECK(fs::exists(h.a.mnt() / rel / "model.hlo_module.pb.lock"));
  // The client lets go without a NEFF: the lease is given back.
  CHECK(::unlink(lock_b.c_str()) == 0);
  bool free = false;
  for (int i = 0; i < 100 && !free; ++i) {
    auto l = neffcache::read_lease(*h.s3, key);
    free = l && l->expired;
    if (!free) std::this_thread::sleep_for(50ms);
  }
  CHECK(free);
  CHECK_FALSE(fs::exists(h.a.mnt() / rel / "model.hlo_module.pb.lock"));
}

TEST_CASE("a look-then-create rank whose create meets another host's lease opens the lock as on a disk",
          "[s3][mount][hosts]") {
  Hosts h("hosts-open", false);
  const std::string rel = rel_of(0);
  const std::string key = rel + "/model.hlo_module.pb.lock";
  const fs::path entry_b = h.b.mnt() / rel;
  fs::create_directories(entry_b);
  auto lease = neffcache::S3Lease::acquire(*h.s3, key, 30s, "host-c");
  REQUIRE(lease.has_value());
  const fs::path lock_b = entry_b / "model.hlo_module.pb.lock";
  // A reader (cat, cp) reads an empty file and takes nothing.
  CHECK(test::slurp(lock_b).empty());
  CHECK_FALSE(fs::exists(h.b.local() / rel / "model.hlo_module.pb.lock"));
  // The kernel finds the name and sends an open, not a create: Python's open(path, "w").
  int fd = ::open(lock_b.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0666);
  REQUIRE(fd >= 0);
  struct stat st {};
  CHECK(::fstat(fd, &st) == 0);
  CHECK(S_ISREG(st.st_mode));
  CHECK(st.st_size == 0);
  ::close(fd);
  // The file is this host's client's lock now, and the other host keeps its lease.
  CHECK(fs::exists(h.b.local() / rel / "model.hlo_module.pb.lock"));
  CHECK(lease->renew().has_value());
  CHECK(::unlink(lock_b.c_str()) == 0);
  CHECK_FALSE(fs::exists(h.b.local() / rel / "model.hlo_module.pb.lock"));
  CHECK(fs::exists(lock_b));  // the other host's, shown again
  CHECK(lease->release().has_value());
}

TEST_CASE("a host killed while its client holds an entry: the other host's ranks go on once the lease lapses",
          "[s3][mount][hosts]") {
  Hosts h("hosts-kill9", true, {"--lease-ttl", "2"});
  const std::string key = rel_of(0) + "/model.hlo_module.pb.lock";
  const fs::path inputs = inputs_of(h.dir, 0);
  // Host A's rank takes the entry's lock and holds it (its compile is long).
  REQUIRE(run_on(h.a, {"mkdir", "-p", (h.a.mnt() / rel_of(0)).string()}));
  test::Child holder(rank_argv(h.a, 0, inputs, "excl", h.log, {"--hold", "120"}), true);
  bool leased = false;
  for (int i = 0; i < 200 && !(leased = h.s3->head(key).has_value()); ++i) std::this_thread::sleep_for(50ms);
  REQUIRE(leased);
  // (Held in host A's name: its daemon runs apart, with a host name of its own.)
  auto record = neffcache::read_lease(*h.s3, key);
  REQUIRE(record.has_value());
  REQUIRE(record->record.has_value());
  CHECK(record->record->host == "host-a");
  // Host B's rank waits on the lock that stands for A's lease.
  const fs::path waiting = h.dir / "waiting";
  std::optional<neffcache::Result<neffcache::detail::Captured>> b;
  std::chrono::steady_clock::time_point done;
  std::atomic<bool> ended{false};
  std::thread rank_b([&] {
    b = neffcache::detail::run_capture(rank_argv(h.b, 0, inputs, "excl", h.log, {"--waiting-file", waiting.string()}),
                                       std::chrono::seconds(120));
    done = std::chrono::steady_clock::now();
    ended = true;
  });
  bool waits = false;
  for (int i = 0; i < 400 && !(waits = fs::exists(waiting)); ++i) std::this_thread::sleep_for(25ms);
  CHECK(waits);
  std::this_thread::sleep_for(1s);
  CHECK_FALSE(ended);  // (still waiting, the lease renewed)

  h.a.kill9();
  const auto killed = std::chrono::steady_clock::now();
  rank_b.join();
  REQUIRE(b.has_value());
  REQUIRE(b->has_value());
  const auto result = result_of((*b)->output);
  INFO(result.dump());
  CHECK(result["outcome"] == "compiled");
  // Within the lease's ttl and 5 s, besides its own compile (0.4 s) and its start.
  CHECK(done - killed < 2s + 5s + 2s);
}

TEST_CASE("a compile that fails on one host: the other host's ranks find the failure, as in a shared folder",
          "[s3][mount][hosts]") {
  Hosts h("hosts-failed", true);
  const std::string rel = rel_of(0);
  const std::string key = rel + "/model.hlo_module.pb.lock";
  const fs::path inputs = inputs_of(h.dir, 0);
  // Host A's rank takes the entry and its compile fails (after long enough for B to wait).
  std::optional<neffcache::Result<neffcache::detail::Captured>> a;
  std::thread rank_a([&] {
    a = neffcache::detail::run_capture(
        rank_argv(h.a, 0, inputs, "excl", h.log, {}, {"NEFFCACHE_FAKE_SECONDS=3", "NEFFCACHE_FAKE_FAIL=70"}),
        std::chrono::seconds(120));
  });
  bool leased = false;
  for (int i = 0; i < 200 && !(leased = h.s3->head(key).has_value()); ++i) std::this_thread::sleep_for(50ms);
  CHECK(leased);
  // Host B's rank looks meanwhile. It either polls A's lock and then finds the failure, as
  // in a shared folder, or (once A's graph is up, its placeholders show) opens the NEFF and
  // waits for A's compile, whose failure answers EIO (docs/SEMANTICS.md, "pending").
  auto waiting = neffcache::detail::run_capture(rank_argv(h.b, 0, inputs, "excl", h.log), std::chrono::seconds(120));
  rank_a.join();
  REQUIRE(a.has_value());
  REQUIRE(a->has_value());
  CHECK(result_of((*a)->output)["outcome"] == "error");  // its compiler failed
  REQUIRE(waiting.has_value());
  const auto first = result_of(waiting->output);
  INFO(first.dump());
  CHECK((first["outcome"] == "cached_failure" || first.dump().find("[Errno 5]") != std::string::npos));
  // The failure went up with A's release: B compiled nothing, and from now on each host
  // shows what the shared folder would (model.log, no NEFF) to every rank.
  CHECK(test::count_lines(h.log) == 1);
  CHECK(h.s3->head(rel + "/model.log").has_value());
  for (const test::S3Mount* host : {&h.b, &h.a}) {
    INFO(host->mnt());
    CHECK(rank_run(*host, 0, inputs, "excl", h.log)["outcome"] == "cached_failure");
    REQUIRE(exists_on(*host, host->mnt() / rel / "model.hlo_module.pb"));  // (the look itself works)
    CHECK(exists_on(*host, host->mnt() / rel / "model.log"));
    CHECK_FALSE(exists_on(*host, host->mnt() / rel / "model.neff"));
    CHECK_FALSE(exists_on(*host, host->mnt() / rel / "model.done"));
  }
  CHECK(test::count_lines(h.log) == 1);
}

TEST_CASE("a lock create while the bucket is silent falls back to a lock on this host within its bound",
          "[s3][mount][hosts]") {
  auto s3 = test::fresh_bucket("hosts-silent");
  test::TempDir dir;
  const fs::path gate = dir / "silent";
  test::FaultyProxy proxy("silent-while", 0, gate.string());
  test::S3Mount host(fmt::format("s3://{}", s3->bucket()), dir / "compiles.log", {},
                     {"AWS_ENDPOINT_URL=" + proxy.endpoint()});
  const std::string rel = rel_of(0);
  // (The ranks' entry folders are made first: a lookup of a new name asks the bucket with
  // the full client's retries, docs/S3.md.)
  fs::create_directories(host.mnt() / rel);
  fs::create_directories(host.mnt() / rel_of(1));
  // The bucket goes silent: each request is read and never answered.
  test::spit(gate, "");
  const fs::path lock = host.mnt() / rel / "model.hlo_module.pb.lock";
  const auto t0 = std::chrono::steady_clock::now();
  // A look-then-create rank: its look asks the bucket within the bound, then its create.
  CHECK_FALSE(fs::exists(lock));
  int fd = ::open(lock.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666);
  const auto took = std::chrono::steady_clock::now() - t0;
  CHECK(fd >= 0);  // never EIO: a lock on this host alone
  if (fd >= 0) ::close(fd);
  WARN(fmt::format("the look and the create took {:.1f} s",
                   std::chrono::duration<double>(took).count()));
  // (One wait for the bound, 2 tries of 5 s: then S3 goes unasked for 30 s.)
  CHECK(took < 20s);
  CHECK(fs::exists(host.local() / rel / "model.hlo_module.pb.lock"));
  // Another rank's look and create, while S3 goes unasked: no wait.
  const fs::path other = host.mnt() / rel_of(1) / "model.hlo_module.pb.lock";
  const auto t1 = std::chrono::steady_clock::now();
  CHECK_FALSE(fs::exists(other));
  fd = ::open(other.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0666);
  CHECK(fd >= 0);
  if (fd >= 0) ::close(fd);
  CHECK(std::chrono::steady_clock::now() - t1 < 2s);
  CHECK(::unlink(other.c_str()) == 0);
  // The bucket answers again: the lock's release works as on a disk.
  fs::remove(gate);
  CHECK(::unlink(lock.c_str()) == 0);
  CHECK_FALSE(fs::exists(lock));
}

TEST_CASE("a host that first sees an entry failed in the bucket shows its failure, never a placeholder",
          "[s3][mount][hosts]") {
  Hosts h("hosts-fresh-failed", false);
  const std::string rel = rel_of(0);
  const fs::path inputs = inputs_of(h.dir, 0);
  for (const char* name : {"compile_flags.json", "model.hlo_module.pb"})
    REQUIRE(h.s3->upload(rel + "/" + name, (inputs / name).string()).has_value());
  REQUIRE(h.s3->put(rel + "/model.log", "neuronx-cc: out of memory\n").has_value());
  // A look-first rank on a host that never saw the entry finds the cached failure.
  const auto r = rank_run(h.b, 0, inputs, "excl", h.log);
  INFO(r.dump());
  CHECK(r["outcome"] == "cached_failure");
  CHECK(test::slurp(h.b.mnt() / rel / "model.log") == "neuronx-cc: out of memory\n");
  CHECK_FALSE(fs::exists(h.b.mnt() / rel / "model.done"));
  CHECK(test::count_lines(h.log) == 0);
  // Another host retries the graph and publishes it: as in a shared folder, model.done wins
  // (within a recent look's reuse, 2 s).
  const std::string neff = "a NEFF another host compiled on retry";
  REQUIRE(h.s3->put(rel + "/model.neff", neff).has_value());
  REQUIRE(h.s3->put(rel + "/model.done", "").has_value());
  nlohmann::json again;
  for (int i = 0; i < 40 && (again = rank_run(h.b, 0, inputs, "excl", h.log))["outcome"] != "hit"; ++i)
    std::this_thread::sleep_for(250ms);
  INFO(again.dump());
  CHECK(again["outcome"] == "hit");
  CHECK(again["neff_bytes"] == neff.size());
  CHECK(test::count_lines(h.log) == 0);
}
