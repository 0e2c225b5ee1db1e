// Just-in-time clients on neffcachefs mounts of one bucket, two hosts of one job. Such a
// client takes an entry's lock, writes its graph and runs `neuronx-cc` itself: the tier
// must neither compile that entry a second time nor keep the client's NEFF from the other
// hosts. With neffcache-cc first in PATH the client's compiles go to the mount, whose
// daemon compiles each graph once across the hosts (the bucket's lease) and serves a graph
// compiled before from the bucket, whatever name the client gives it.
#include <array>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <optional>
#include <thread>

#include <catch2/catch_test_macros.hpp>

#include <fmt/format.h>

#include <neffcache/s3/lease.hpp>

#include "jit.hpp"
#include "s3_mount.hpp"
#include "s3_support.hpp"
#include "support.hpp"

namespace {

// The fake compiler takes this long: a client's compile and a compile of the tier
// would overlap if the tier did not wait for the client.
const std::vector<std::string> k_jit_daemon_env{"NEFFCACHE_FAKE_SECONDS=0.3", "NEFFCACHE_FAKE_IDLE=1"};

// Two hosts of one job, each a mount of one fresh bucket. The compiles of both (their
// daemons' and their clients' own) go to one log.
// The tests name its members through a structured binding; a lambda names them through the
// object (clang before 16 cannot capture a structured binding).
struct TwoHosts {
  explicit TwoHosts(std::string_view what)
      : s3(test::fresh_bucket(what)),
        real(test::real_compiler_dir(dir)),
        log(dir / "compiles.log"),
        host_a(url(), log, {}, k_jit_daemon_env),
        host_b(url(), log, {}, k_jit_daemon_env) {}
  std::string url() const { return fmt::format("s3://{}", s3->bucket()); }

  std::unique_ptr<neffcache::S3Client> s3;
  test::TempDir dir;
  const test::fs::path real, log;
  test::S3Mount host_a, host_b;
};

// A compile by the Neuron wrapper through the shim (first in PATH, the fake compiler of
// `real` behind it, logging to `log`) on host `host` (its own HOME, where the shim keeps
// what it knows of the compiler) with `url` as its cache.
std::vector<std::string> shim_compile(const test::TempDir& dir, const test::fs::path& real, const test::fs::path& log,
                                      const std::string& host, const test::fs::path& hlo, const test::fs::path& out,
                                      const std::string& url) {
  std::vector<std::string> argv{"env"};
  for (auto& w : test::s3_env_words({"NEURON_COMPILE_CACHE_URL=" + url, "NEFFCACHE_FAKE_RATE=0",
                                     "NEFFCACHE_FAKE_SECONDS=0.5", "NEFFCACHE_FAKE_LOG=" + log.string(),
                                     "HOME=" + (dir / host).string(),
                                     "PATH=" + test::path_with({test::k_shim_dir, real})}))
    argv.push_back(w);
  argv.insert(argv.end(), {"neuronx-cc", "compile", hlo.string(), "--framework", "XLA", "--target", "trn2",
                           "--output", out.string(), "-O1"});
  return argv;
}

}  // namespace

TEST_CASE("a just-in-time client on a bucket mount: its own compile is the entry's, and goes to the other hosts",
          "[s3][mount][jit]") {
  TwoHosts hosts("jithosts");
  auto& [s3, dir, real, log, host_a, host_b] = hosts;
  const test::JitGraphs g = test::jit_graphs(dir);
  const test::fs::path &a = g.a, &b = g.b;
  // No shim: the clients run the real compiler themselves.
  auto on = [&](const test::S3Mount& host) {
    return test::jit_env(host.mnt(), hosts.log, test::path_with({hosts.real}));
  };

  auto first = test::train_jit(test::ranks_of(2, on(host_a)), {a, b});
  CHECK(test::sum_of(first, "failed") == 0);
  CHECK(test::sum_of(first, "compiled") == 2);
  // The clients' compiles only: the tier waited for each client and compiled nothing.
  CHECK(test::count_lines(log) == 2);
  // Both NEFFs go up as the clients finish them (in the background).
  bool published = false;
  for (int i = 0; i < 200 && !(published = host_a.stats()["s3"]["published"] == 2); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  CHECK(published);

  // Host B's ranks load the same graphs under the same names: fetched, never compiled.
  auto second = test::train_jit(test::ranks_of(2, on(host_b)), {a, b});
  CHECK(test::sum_of(second, "failed") == 0);
  CHECK(test::sum_of(second, "compiled") == 0);
  CHECK(test::count_lines(log) == 2);
  CHECK(host_b.stats()["s3"]["fetches"] == 2);
  for (const auto& s : second)
    for (const auto& g : s["per_graph"]) CHECK(g["neff_bytes"].get<int>() > 0);
}

TEST_CASE("a just-in-time client's failed compile on a bucket mount is its entry's record: the tier does not compile "
          "the graph again",
          "[s3][mount][jit]") {
  TwoHosts hosts("jitfail");
  auto& [s3, dir, real, log, host_a, host_b] = hosts;
  auto env = test::jit_env(host_a.mnt(), log, test::path_with({real}));
  env.push_back("NEFFCACHE_FAKE_FAIL=1");
  auto rank = test::start_jit(env, {test::jit_graphs(dir).a});
  const std::string text = rank->rest();
  CHECK(rank->wait() != 0);  // (the graph failed)
  CHECK(text.find("\"failed\": 1") != std::string::npos);
  CHECK(test::count_lines(log) == 1);
  // The tier's job for the entry looks again each second once the client has let go.
  std::this_thread::sleep_for(std::chrono::seconds(3));
  CHECK(test::count_lines(log) == 1);
}

TEST_CASE("neffcache-cc on two hosts sharing a bucket: twins of graphs compiled before compile nowhere, a new "
          "graph once for both hosts",
          "[s3][mount][shim]") {
  TwoHosts hosts("shimhosts");
  auto& [s3, dir, real, log, host_a, host_b] = hosts;
  const auto [a, b, a2, b2, c] = test::jit_graphs(dir);
  // The clients of a host use its mount as their cache, with the shim first in PATH.
  auto on = [&](const test::S3Mount& host) {
    return test::jit_env(host.mnt(), hosts.log, test::path_with({test::k_shim_dir, hosts.real}));
  };

  // An earlier job, on host A only.
  auto first = test::train_jit(test::ranks_of(2, on(host_a)), {a, b});
  CHECK(test::sum_of(first, "failed") == 0);
  CHECK(test::count_lines(log) == 2);
  // The next job: two ranks on each host, its graphs under new names.
  auto ranks = test::ranks_of(2, on(host_a));
  for (auto& r : test::ranks_of(2, on(host_b))) ranks.push_back(r);
  auto second = test::train_jit(ranks, {a2, b2, c});
  CHECK(test::sum_of(second, "failed") == 0);
  for (const auto& s : second)
    for (const auto& g : s["per_graph"]) CHECK(g["neff_bytes"].get<int>() > 0);
  INFO(test::slurp(log));
  CHECK(test::count_lines(log) == 3);  // the new graph, once for both hosts
}

TEST_CASE("a just-in-time client's compile holds the bucket's lease: another host waits for its NEFF",
          "[s3][mount][jit]") {
  TwoHosts hosts("jitstandin");
  auto& [s3, dir, real, log, host_a, host_b] = hosts;
  const test::fs::path a = test::jit_graphs(dir).a;
  auto on = [&](const test::S3Mount& host) {
    auto env = test::jit_env(host.mnt(), hosts.log, test::path_with({hosts.real}));
    // The client's own compile is slow. (Inserted from an array: GCC 12's -Warray-bounds
    // misreads a push_back of a temporary string here once inlined.)
    static const std::array<std::string, 1> slow{"NEFFCACHE_FAKE_SECONDS=4"};
    env.insert(env.end(), slow.begin(), slow.end());
    return env;
  };

  // Host A's client compiles the graph itself; its tier takes the entry's lease for it and
  // puts the graph up.
  auto rank_a = test::start_jit(on(host_a), {a});
  auto leased_graph = [&] {
    auto l = hosts.s3->list("");
    if (!l) return false;
    bool hlo = false, lease = false;
    for (const auto& o : l->objects) {
      hlo = hlo || o.key.ends_with("/model.hlo_module.pb");
      lease = lease || o.key.ends_with("/model.hlo_module.pb.lock");
    }
    return hlo && lease;
  };
  // (Within the client's compile: started, under sanitizers, in seconds.)
  bool seen = false;
  for (int i = 0; i < 1000 && !(seen = leased_graph()); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  CHECK(seen);
  // Host B's client finds the graph there while host A's client still compiles it, and
  // waits for that NEFF rather than having it compiled again.
  auto second = test::train_jit({on(host_b)}, {a});
  auto first = test::summary_of(*rank_a);
  CHECK(first["compiled"] == 1);
  CHECK(second[0]["failed"] == 0);
  CHECK(second[0]["compiled"] == 0);
  CHECK(second[0]["per_graph"][0]["neff_bytes"] == first["per_graph"][0]["neff_bytes"]);
  CHECK(test::count_lines(log) == 1);
  CHECK(host_b.stats()["s3"]["fetches"] == 1);
}

TEST_CASE("neffcache-cc with an s3:// cache: a graph compiled on one host is a hit on another under any name, a "
          "graph two hosts compile at once compiles once; a bucket it cannot reach costs one warning",
          "[s3][shim]") {
  auto s3 = test::fresh_bucket("shimurl");
  test::TempDir dir;
  const test::fs::path real = test::real_compiler_dir(dir), log = dir / "compiles.log";
  const auto [a, b, a2, b2, c] = test::jit_graphs(dir);
  auto compile_argv = [&](const std::string& host, const test::fs::path& hlo, const test::fs::path& out,
                          const std::string& url) { return shim_compile(dir, real, log, host, hlo, out, url); };
  const std::string url = fmt::format("s3://{}/team", s3->bucket());

  auto first = test::run(compile_argv("host-a", a, dir / "a.neff", url));
  REQUIRE(first.exit_code == 0);
  CHECK(test::count_lines(log) == 1);
  // The other host, the graph under another name (other debug metadata): served.
  auto twin = test::run(compile_argv("host-b", a2, dir / "a2.neff", url));
  CHECK(twin.exit_code == 0);
  CHECK(twin.output.find("Compiler status PASS\n") != std::string::npos);
  CHECK(test::slurp(dir / "a2.neff") == test::slurp(dir / "a.neff"));
  CHECK(test::count_lines(log) == 1);
  // The bucket holds the shim's entry as any done entry: graph, flags, NEFF, marker.
  auto listed = s3->list("team/");
  REQUIRE(listed);
  std::vector<std::string> names;
  for (const auto& o : listed->objects)  // (the bucket's content index aside)
    if (!o.key.starts_with("team/.neffcache/")) names.push_back(test::fs::path(o.key).filename().string());
  std::sort(names.begin(), names.end());
  CHECK(names == std::vector<std::string>{"compile_flags.json", "model.done", "model.hlo_module.pb", "model.neff"});

  // Both hosts start a new graph at once: one compiles under the lease, the other waits
  // and is served.
  test::Child on_a(compile_argv("host-a", c, dir / "c-a.neff", url), /*quiet_stderr=*/true);
  test::Child on_b(compile_argv("host-b", c, dir / "c-b.neff", url), /*quiet_stderr=*/true);
  on_a.rest();
  on_b.rest();
  CHECK(on_a.wait() == 0);
  CHECK(on_b.wait() == 0);
  CHECK(test::count_lines(log) == 2);
  CHECK(test::slurp(dir / "c-a.neff") == test::slurp(dir / "c-b.neff"));

  // A bucket that does not exist: one warning, and the real compiler runs as without us.
  auto gone = test::run(compile_argv("host-a", b, dir / "b.neff", "s3://neffcache-no-such-bucket"));
  CHECK(gone.exit_code == 0);
  CHECK(gone.output.starts_with("neffcache-cc: warning: "));
  CHECK(test::count_lines(log) == 3);
  CHECK(test::fs::file_size(dir / "b.neff") > 0);
}

TEST_CASE("neffcache-cc publishing to an s3:// cache drops the failure its entry recorded before", "[s3][shim]") {
  auto s3 = test::fresh_bucket("shimfailed");
  test::TempDir dir;
  const test::fs::path real = test::real_compiler_dir(dir), log = dir / "compiles.log";
  const test::fs::path a = test::jit_graphs(dir).a;
  const std::string url = fmt::format("s3://{}/team", s3->bucket());
  REQUIRE(test::run(shim_compile(dir, real, log, "host-a", a, dir / "a.neff", url)).exit_code == 0);
  auto objects = [&] {
    std::vector<std::string> names;
    if (auto listed = s3->list("team/"))
      for (const auto& o : listed->objects)  // (the bucket's content index aside)
        if (!o.key.starts_with("team/.neffcache/")) names.push_back(o.key);
    std::sort(names.begin(), names.end());
    return names;
  };
  const auto done = objects();
  REQUIRE(done.size() == 4);  // compile_flags.json, model.done, model.hlo_module.pb, model.neff
  const std::string base = test::fs::path(done.front()).parent_path().string();
  // The entry as a failed compile of another tool leaves it: its log, no NEFF, no marker.
  REQUIRE(s3->remove(base + "/model.neff"));
  REQUIRE(s3->remove(base + "/model.done"));
  REQUIRE(s3->put(base + "/model.log", "compile failed: out of memory\n"));
  // The shim compiles it again and publishes: the entry is done, and no longer failed.
  CHECK(test::run(shim_compile(dir, real, log, "host-a", a, dir / "a2.neff", url)).exit_code == 0);
  CHECK(test::count_lines(log) == 2);
  CHECK(objects() == done);
}

namespace {

// A shim that compiles a new graph into an s3:// cache and waits for the host's memory with
// the entry's lease taken: another process of the host waits for 900 MiB of the 1 GiB budget,
// and the shim's graph, predicted to need the whole budget, waits behind it.
struct ShimWaitingForMemory {
  static constexpr uint64_t MiB = 1 << 20;
  explicit ShimWaitingForMemory(std::string_view what)
      : s3(test::fresh_bucket(what)),
        real(test::real_compiler_dir(dir)),
        log(dir / "compiles.log"),
        other((dir / "ledger").string(), 1024 * MiB, 900 * MiB) {
    auto argv = shim_compile(dir, real, log, "host-a", test::jit_graphs(dir).a, dir / "a.neff",
                             fmt::format("s3://{}/team", s3->bucket()));
    argv.insert(std::find(argv.begin(), argv.end(), "neuronx-cc"),
                {"NEFFCACHE_MEM_LEDGER=" + (dir / "ledger").string(), "NEFFCACHE_MEM_BUDGET=1GiB"});
    shim.emplace(argv, /*quiet_stderr=*/true);
    REQUIRE(other.hold_until_shim_waits());
    // It took the entry's lease before it asked for memory: the bucket holds only that.
    auto listed = s3->list("team/");
    REQUIRE(listed);
    REQUIRE(listed->objects.size() == 1);
    lease_key = listed->objects.front().key;
    auto read = neffcache::read_lease(*s3, lease_key);
    REQUIRE(read);
    REQUIRE(read->record);
    lease = *read->record;
  }
  // How often the shim renews its lease: a quarter of its ttl.
  std::chrono::seconds renewal_interval() const { return std::max(std::chrono::seconds(1), lease.ttl / 4); }

  std::unique_ptr<neffcache::S3Client> s3;
  test::TempDir dir;
  const test::fs::path real, log;
  test::WaitingClaim other;
  std::optional<test::Child> shim;
  std::string lease_key;
  neffcache::LeaseRecord lease;  // as the shim first wrote it
};

}  // namespace

TEST_CASE("neffcache-cc on an s3:// cache renews its lease while it waits for the host's memory", "[s3][shim][memory]") {
  using namespace std::chrono_literals;
  ShimWaitingForMemory w("shimwait");
  // Within a renewal interval of waiting, and some time for the write, the lease is written
  // again: another host still finds it live when the ttl has passed since it was taken.
  const auto interval = w.renewal_interval();
  w.other.hold(interval);
  auto during = neffcache::read_lease(*w.s3, w.lease_key);
  for (auto until = std::chrono::steady_clock::now() + 10s;
       during && during->record && during->record->seq == w.lease.seq && std::chrono::steady_clock::now() < until;)
    w.other.hold(500ms), during = neffcache::read_lease(*w.s3, w.lease_key);
  REQUIRE(during);
  REQUIRE(during->record);
  CHECK(during->record->instance == w.lease.instance);
  CHECK(during->record->seq > w.lease.seq);
  CHECK(during->age < interval);
  CHECK(test::count_lines(w.log) == 0);
  w.other.set(0);  // the memory is free: the shim compiles and publishes
  CHECK(w.shim->wait() == 0);
  CHECK(test::count_lines(w.log) == 1);
  CHECK_FALSE(neffcache::read_lease(*w.s3, w.lease_key));  // settled: the lease is gone
}

TEST_CASE("neffcache-cc whose lease passed to another host while it waited for memory compiles nothing: it serves "
          "that host's NEFF",
          "[s3][shim][memory]") {
  using namespace std::chrono_literals;
  ShimWaitingForMemory w("shimlost");
  // Another host takes the lease over (as after a partition that kept the shim from renewing
  // it for a whole ttl): the shim's next renewal finds it lost, and its wait for memory ends.
  neffcache::LeaseRecord theirs;
  theirs.host = "host-b";
  theirs.instance = "their-instance";
  REQUIRE(w.s3->put(w.lease_key, neffcache::detail::lease_json(theirs)));
  w.other.hold(w.renewal_interval() + 3s);
  // That host publishes its NEFF and gives its lease back. The host's memory stays taken
  // (for a minute at most; a shim that still waited for it would compile then): the shim no
  // longer waits for it.
  const std::string base = test::fs::path(w.lease_key).parent_path().string();
  REQUIRE(w.s3->put(base + "/model.neff", "NEFF of host-b"));
  REQUIRE(w.s3->put(base + "/model.done", ""));
  REQUIRE(w.s3->remove(w.lease_key));
  std::atomic<bool> exited = false;
  std::thread taken([&] {
    for (auto until = std::chrono::steady_clock::now() + 60s; !exited && std::chrono::steady_clock::now() < until;)
      w.other.hold(100ms);
  });
  const int status = w.shim->wait();
  exited = true;
  taken.join();
  CHECK(status == 0);
  CHECK(test::count_lines(w.log) == 0);
  CHECK(test::slurp(w.dir / "a.neff") == "NEFF of host-b");
}

TEST_CASE("neffcache-cc and the bucket's content index: its results are twins for other entries, and it is served "
          "a graph compiled under another entry's name",
          "[s3][shim][index]") {
  auto s3 = test::fresh_bucket("shimindex");
  test::TempDir dir;
  const test::fs::path real = test::real_compiler_dir(dir), log = dir / "compiles.log";
  const auto [a, b, a2, b2, c] = test::jit_graphs(dir);
  const std::string url = fmt::format("s3://{}", s3->bucket());
  auto farm = [&] {  // a compile pass on the bucket (neffcache compile, as a farm runs it)
    return test::run(test::s3_tool_argv({"compile", "--cache", url, "--compiler", test::k_fake_template},
                                        {"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_LOG=" + log.string()}));
  };
  REQUIRE(test::run(shim_compile(dir, real, log, "host-a", a, dir / "a.neff", url)).exit_code == 0);
  REQUIRE(test::count_lines(log) == 1);
  // The shim's entry, as every host names it, and its flags.
  auto listed = s3->list("");
  REQUIRE(listed.has_value());
  std::string shim_entry;
  for (const auto& o : listed->objects)
    if (o.key.ends_with("/model.neff") && !o.key.starts_with(".neffcache")) shim_entry = o.key.substr(0, o.key.rfind('/'));
  REQUIRE(!shim_entry.empty());
  const std::string flags = s3->get(shim_entry + "/compile_flags.json").value();
  const std::string folder = shim_entry.substr(0, shim_entry.find('/'));

  // Another client's entry of the same graph and flags, under its own name: served from the
  // shim's result by a compile pass, no compile.
  const std::string theirs = folder + "/MODULE_77+other";
  REQUIRE(s3->put(theirs + "/compile_flags.json", flags).has_value());
  REQUIRE(s3->put(theirs + "/model.hlo_module.pb", test::slurp(a)).has_value());
  auto pass = farm();
  INFO(pass.output);
  CHECK(pass.exit_code == 0);
  CHECK(test::count_lines(log) == 1);
  CHECK(s3->get(theirs + "/model.neff").value() == test::slurp(dir / "a.neff"));

  // The other way: a graph compiled under another client's name first; the shim, asked for
  // it, is served that NEFF and compiles nothing.
  const std::string first = folder + "/MODULE_88+other";
  REQUIRE(s3->put(first + "/compile_flags.json", flags).has_value());
  REQUIRE(s3->put(first + "/model.hlo_module.pb", test::slurp(b)).has_value());
  REQUIRE(farm().exit_code == 0);
  REQUIRE(test::count_lines(log) == 2);
  auto served = test::run(shim_compile(dir, real, log, "host-b", b, dir / "b.neff", url));
  INFO(served.output);
  CHECK(served.exit_code == 0);
  CHECK(served.output.find("Compiler status PASS\n") != std::string::npos);
  CHECK(test::count_lines(log) == 2);
  CHECK(test::slurp(dir / "b.neff") == s3->get(first + "/model.neff").value());
}

TEST_CASE("neffcache-cc with an s3:// cache hands the real compiler none of its connections to the bucket",
          "[s3][shim]") {
  auto s3 = test::fresh_bucket("shimfds");
  test::TempDir dir;
  // The real compiler notes the descriptors it was given, then compiles.
  const test::fs::path real = dir / "sdk-bin", log = dir / "compiles.log", fds = dir / "fds.txt";
  test::fs::create_directories(real);
  test::spit(real / "neuronx-cc",
             fmt::format("#!/bin/sh\nls -l /proc/$$/fd >> {}\nexec {} \"$@\"\n", fds.string(), test::k_fake));
  test::fs::permissions(real / "neuronx-cc", test::fs::perms::owner_all);
  const auto g = test::jit_graphs(dir);
  const std::string url = fmt::format("s3://{}/team", s3->bucket());
  // A miss: the shim has asked the bucket, and runs the real compiler. Started with its stdio
  // alone (this process's own connections to the bucket are no one's to hand on), so that
  // any other descriptor the real compiler has is one the shim gave it.
  auto argv = shim_compile(dir, real, log, "host-a", g.a, dir / "a.neff", url);
  argv.insert(argv.begin(), {"python3", "-c", "import os, sys; os.closerange(3, 1 << 16); os.execvp(sys.argv[1], sys.argv[1:])"});
  REQUIRE(test::run(argv).exit_code == 0);
  REQUIRE(test::count_lines(log) == 1);
  const std::string listed = test::slurp(fds);
  INFO(listed);
  CHECK(listed.find(" 2 -> ") != std::string::npos);  // (its stderr: the listing is there)
  CHECK(listed.find("socket:") == std::string::npos);
}
