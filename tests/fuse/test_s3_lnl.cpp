// The LNL cache (vLLM Neuron, TorchNeuron) over an s3:// mount, for real against
// radosgw: the mount as NEURON_LIBTORCH_REMOTE_CACHE, where save_cache()'s rename of a
// staging folder to the key publishes the entry to the bucket for every host, and a
// second promotion of a key is refused; and as the local cache itself, where a pending
// entry compiles once across hosts under its S3 lease.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <optional>
#include <sstream>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/cache/lnl.hpp>
#include <neffcache/s3/cache.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "lnl.hpp"
#include "nki.hpp"
#include "process.hpp"
#include "s3_mount.hpp"
#include "s3_support.hpp"
#include "support.hpp"

using namespace neffcache;
using namespace std::chrono_literals;
namespace fs = std::filesystem;

namespace {

using Host = test::S3Mount;  // one host of the fleet

using test::k_daemon;
using test::k_sim;
using test::k_fake_template;
using test::read_all;

// An LNL entry as a client's local cache holds it once compiled: graph.hlo,
// command.txt, LNL's metadata, the NEFF, its log and the marker.
fs::path compiled_lnl_entry(const fs::path& folder, const std::string& key, const std::string& neff) {
  fs::create_directories(folder);
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", folder / "graph.hlo", fs::copy_options::overwrite_existing);
  test::spit(folder / "command.txt", test::lnl_command_text(key, {"-O1"}));
  test::spit(folder / ".artifact_metadata_v0.json", fmt::format(R"({{"cache_key": "{}", "version": 0}})", key));
  test::spit(folder / lnl_neff_name(key), neff);
  test::spit(folder / "log-neuron-cc.txt", "Compiler status PASS\n");
  test::spit(folder / ".compilation_complete", lnl_marker(1790000000, neff.size()));
  return folder;
}

// save_cache() through a mount, as LNL does it on a shared disk: the entry copied into a
// staging folder beside the keys, then renamed to the key. 0, or the rename's errno
// (the staging folder is removed then, as LNL leaves nothing behind).
int save_cache(const fs::path& remote, const std::string& key, const std::string& neff, const std::string& tag) {
  const fs::path staging = remote / fmt::format("{}.tmp.{}", key, tag);
  compiled_lnl_entry(staging, key, neff);
  if (::rename(staging.c_str(), (remote / key).c_str()) == 0) return 0;
  int err = errno;
  fs::remove_all(staging);
  return err;
}

// The LNL compiles of the fake compiler's log ("pid uid input" lines; the input is
// graph.hlo in a work folder named after the key).
int lnl_compiles(const fs::path& log, const std::string& key) {
  if (!fs::exists(log)) return 0;
  std::istringstream in(test::slurp(log));
  int n = 0;
  for (std::string pid, uid, input; in >> pid >> uid >> input;) n += input.find(key) != std::string::npos;
  return n;
}

// Two hosts, each a mount of one fresh bucket (of `prefix` in it, if any), whose compiles
// go to one log.
// The tests name its members through a structured binding; a lambda names them through the
// object (clang before 16 cannot capture a structured binding).
struct LnlHosts {
  explicit LnlHosts(std::string_view what, std::string_view prefix = {})
      : s3(test::fresh_bucket(what)),
        log(dir / "compiles.log"),
        url(prefix.empty() ? fmt::format("s3://{}", s3->bucket()) : fmt::format("s3://{}/{}", s3->bucket(), prefix)),
        a(url, log),
        b(url, log) {}

  std::unique_ptr<S3Client> s3;
  test::TempDir dir;
  const fs::path log;
  const std::string url;
  Host a, b;
};

}  // namespace

TEST_CASE("save_cache() onto a bucket mount publishes the entry for another host; a second promotion is refused",
          "[s3][mount][lnl]") {
  LnlHosts hosts("lnlpromote", "remote");
  auto& [s3, dir, log, url, a, b] = hosts;
  const std::string key = test::lnl_key("promoted once");

  CHECK(save_cache(a.mnt(), key, "host a's NEFF", "a") == 0);
  // On S3: every file of the entry, the marker in LNL's format, and no lease left.
  const std::string base = "remote/" + key;
  CHECK(s3->get(base + "/" + lnl_neff_name(key)).value() == "host a's NEFF");
  CHECK(s3->get(base + "/.compilation_complete").value() == lnl_marker(1790000000, 13));
  for (const char* f : {"graph.hlo", "command.txt", ".artifact_metadata_v0.json", "log-neuron-cc.txt"})
    CHECK(s3->head(base + "/" + f).has_value());
  CHECK_FALSE(s3->head(base + "/.neffcache-lease").has_value());
  // Host a sees it where it was renamed to, and its staging folder is gone.
  CHECK(read_all(a.mnt() / key / lnl_neff_name(key)).second == "host a's NEFF");
  CHECK_FALSE(fs::exists(a.mnt() / (key + ".tmp.a")));

  // Host b: the key is on the remote (LNL's check for the marker), and its NEFF is
  // fetched, not compiled.
  struct stat st {};
  CHECK(::stat((b.mnt() / key / ".compilation_complete").c_str(), &st) == 0);
  CHECK(read_all(b.mnt() / key / lnl_neff_name(key)).second == "host a's NEFF");
  CHECK(read_all(b.mnt() / key / ".compilation_complete").second == lnl_marker(1790000000, 13));
  CHECK(b.stats()["s3"]["fetches"] == 1);
  CHECK_FALSE(fs::exists(log));

  // A second promotion of the key, from either host, fails as a rename onto a full
  // folder does on a local disk, and overwrites nothing.
  for (Host* h : {&b, &a}) {
    int err = save_cache(h->mnt(), key, "a NEFF that must not win", "again");
    CHECK((err == ENOTEMPTY || err == EEXIST));
  }
  CHECK(s3->get(base + "/" + lnl_neff_name(key)).value() == "host a's NEFF");
  CHECK(read_all(b.mnt() / key / lnl_neff_name(key)).second == "host a's NEFF");
}

TEST_CASE("two hosts promote the same key at once: one wins, the other's rename fails, nothing is overwritten",
          "[s3][mount][lnl]") {
  LnlHosts hosts("lnlrace");
  auto& [s3, dir, log, url, a, b] = hosts;
  for (int round = 0; round < 4; ++round) {
    const std::string key = test::lnl_key(fmt::format("race {}", round));
    // The staging folders are written first: the threads only rename (Catch2's assertions,
    // which the file helpers use, may not run on two threads at once).
    const fs::path staged_a = compiled_lnl_entry(a.mnt() / (key + ".tmp.a"), key, "NEFF of host a");
    const fs::path staged_b = compiled_lnl_entry(b.mnt() / (key + ".tmp.b"), key, "NEFF of host b");
    std::atomic<int> ready{0};
    int err_a = -1, err_b = -1;
    auto promote = [&](const Host& h, const fs::path& staged, int& err) {
      ++ready;
      while (ready < 2) std::this_thread::yield();
      err = ::rename(staged.c_str(), (h.mnt() / key).c_str()) == 0 ? 0 : errno;
    };
    std::thread ta([&] { promote(hosts.a, staged_a, err_a); });
    std::thread tb([&] { promote(hosts.b, staged_b, err_b); });
    ta.join();
    tb.join();
    // As LNL leaves nothing behind: the loser's staging folder goes.
    for (const auto& staged : {staged_a, staged_b}) fs::remove_all(staged);
    INFO("round " << round << ": " << err_a << " " << err_b);
    CHECK(((err_a == 0) != (err_b == 0)));
    for (int err : {err_a, err_b}) CHECK((err == 0 || err == ENOTEMPTY || err == EEXIST));
    const std::string winner = err_a == 0 ? "NEFF of host a" : "NEFF of host b";
    CHECK(s3->get(key + "/" + lnl_neff_name(key)).value() == winner);
    CHECK(s3->get(key + "/.compilation_complete").value() == lnl_marker(1790000000, winner.size()));
    // Both hosts read the winner's NEFF.
    CHECK(read_all(a.mnt() / key / lnl_neff_name(key)).second == winner);
    CHECK(read_all(b.mnt() / key / lnl_neff_name(key)).second == winner);
  }
}

TEST_CASE("vLLM ranks on two hosts with the bucket mount as NEURON_LIBTORCH_REMOTE_CACHE: compiled once, fetched by the other",
          "[s3][mount][lnl]") {
  LnlHosts hosts("lnlranks");
  auto& [s3, dir, log, url, a, b] = hosts;
  // A rank on host `h` with its own local cache; it must succeed. Its output.
  auto rank = [&](const Host& h, const std::string& local) {
    auto r = test::run({"env", "-u", "VLLM_NEURON_DISABLE_WARMUP_COMPILE",
                        "VLLM_CACHE_ROOT=" + (hosts.dir / local).string(),
                        "NEURON_LIBTORCH_REMOTE_CACHE=" + h.mnt().string(), "NEFFCACHE_FAKE_RATE=0",
                        "NEFFCACHE_FAKE_LOG=" + hosts.log.string(), k_sim, "--dialect", "lnl", "--json", "--save-cache",
                        "--compiler", k_fake_template, "--flag=-O1",
                        (test::k_corpus / "spu_tf_jit_comp.hlo.pb").string(),
                        (test::k_corpus / "gopjrt_jax_xp1.hlo.pb").string()});
    INFO(r.output);
    REQUIRE(r.exit_code == 0);
    return r.output;
  };
  const std::string first = rank(a, "host-a");
  INFO(first);
  CHECK(first.find(R"("compiled": 2)") != std::string::npos);
  CHECK(first.find(R"("promoted": 2)") != std::string::npos);
  CHECK(test::count_lines(log) == 2);
  // Host b's rank finds both graphs on the remote (through its own daemon and tier) and
  // compiles nothing.
  const std::string second = rank(b, "host-b");
  INFO(second);
  CHECK(second.find(R"("fetched": 2)") != std::string::npos);
  CHECK(second.find(R"("compiled": 0)") != std::string::npos);
  CHECK(test::count_lines(log) == 2);
  CHECK(b.stats()["s3"]["fetches"] == 2);
}

TEST_CASE("the bucket mount as the LNL cache itself: a pending entry compiles once across two hosts, marker last",
          "[s3][mount][lnl]") {
  auto s3 = test::fresh_bucket("lnlpending");
  const std::string key = test::lnl_key("pending on the bucket");
  {
    test::TempDir src;
    auto folder = test::make_lnl_entry(src.path(), "spu_credit_fraud_test.hlo.pb", key, {"-O2"});
    for (const char* f : {"command.txt", ".artifact_metadata_v0.json", "graph.hlo"})
      REQUIRE(s3->upload(key + "/" + f, (folder / f).string()).has_value());
  }
  test::TempDir dir;
  const fs::path log = dir / "compiles.log";
  const std::vector<std::string> env = test::exclusive_compile_env(dir / "exclusive");
  const std::string url = fmt::format("s3://{}", s3->bucket());
  Host a(url, log, {}, env), b(url, log, {}, env);
  // The key is listed at the root, and its pending entry shows LNL's products.
  bool listed = false;
  for (const auto& e : fs::directory_iterator(a.mnt())) listed |= e.path().filename() == key;
  CHECK(listed);
  struct stat st {};
  CHECK(::stat((b.mnt() / key / ".compilation_complete").c_str(), &st) == 0);

  std::vector<std::pair<int, std::string>> got(6);
  std::vector<std::thread> readers;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const fs::path p = (i % 2 ? b.mnt() : a.mnt()) / key / (i % 3 ? lnl_neff_name(key) : ".compilation_complete");
    readers.emplace_back([&g = got[i], p] { g = read_all(p); });
  }
  for (auto& t : readers) t.join();
  for (const auto& [err, bytes] : got) CHECK(err == 0);
  CHECK(lnl_compiles(log, key) == 1);
  CHECK_FALSE(fs::exists(dir / "exclusive" / "clashes"));
  const std::string neff = s3->get(key + "/" + lnl_neff_name(key)).value();
  auto parsed = fake::parse_fake_neff(neff);
  REQUIRE(parsed.has_value());
  CHECK(parsed->flags == R"(["--target=trn1", "-O2"])");  // the entry's own arguments
  CHECK(read_all(a.mnt() / key / lnl_neff_name(key)).second == neff);
  CHECK(read_all(b.mnt() / key / lnl_neff_name(key)).second == neff);
  auto marker = s3->get(key + "/.compilation_complete");
  REQUIRE(marker.has_value());
  CHECK(lnl_marker_neff_size(*marker) == neff.size());
  CHECK(s3->head(key + "/log-neuron-cc.txt").has_value());
  CHECK_FALSE(s3->head(key + "/.neffcache-lease").has_value());
}

TEST_CASE("save_cache() of a graph calling an NKI kernel takes the kernel to the bucket first; a host without it "
          "fetches it to compile",
          "[s3][mount][lnl][nki]") {
  auto s3 = test::fresh_bucket("lnlnki");
  test::TempDir dir;
  const fs::path log = dir / "compiles.log";
  const fs::path kernels = dir / "nki-intermediate-cache", kernel = kernels / "ab" / "k.klir";
  test::spit(kernel, "a kernel binary");
  const std::string url = fmt::format("s3://{}/remote", s3->bucket());
  const std::vector<std::string> options{"--nki-kernels", kernels.string()};
  Host a(url, log, options), b(url, log, options);
  const std::string key = test::lnl_key("calls a kernel");

  // A pending entry, promoted by rename as save_cache() does: its kernel is in the bucket.
  const fs::path staging = a.mnt() / (key + ".tmp");
  fs::create_directories(staging);
  test::spit(staging / "graph.hlo", test::graph_calling(kernel.string()));
  test::spit(staging / "command.txt", test::lnl_command_text(key, {"-O1"}));
  test::spit(staging / ".artifact_metadata_v0.json", fmt::format(R"({{"cache_key": "{}", "version": 0}})", key));
  REQUIRE(::rename(staging.c_str(), (a.mnt() / key).c_str()) == 0);
  CHECK(s3->get("remote/.neffcache/nki-kernels/ab/k.klir").value() == "a kernel binary");
  CHECK(s3->head("remote/" + key + "/graph.hlo").has_value());

  // Host b lacks the kernel: its open of the NEFF fetches the kernel, then compiles.
  fs::remove_all(kernels);
  auto [err, neff] = read_all(b.mnt() / key / lnl_neff_name(key));
  CHECK(err == 0);
  CHECK(fake::parse_fake_neff(neff).has_value());
  CHECK(test::slurp(kernel) == "a kernel binary");
  CHECK(lnl_compiles(log, key) == 1);
  CHECK(s3->head("remote/" + key + "/.compilation_complete").has_value());
}

TEST_CASE("LNL ranks of two hosts (each in a PID namespace of its own) with one bucket mount as their cache compile "
          "a new key once; lock and holder files stay on their host", "[s3][mount][lnl][conformance]") {
  // The independent client (tests/support/lnl_client.py, written from the facts). Were a
  // host's holder file uploaded, a rank of the other host would judge its pid against
  // its own /proc, find another process or none, and clear the entry's marker. A rank's
  // flock takes the key's lease: the other host's ranks wait in theirs, then find the
  // entry done.
  auto s3 = test::fresh_bucket("lnlhosts");
  test::TempDir dir;
  const fs::path log = dir / "compiles.log", client_log = dir / "client-compiles.log";
  const std::string url = fmt::format("s3://{}", s3->bucket());
  Host a(url, log), b(url, log);
  const std::string key = test::lnl_key("two hosts, two PID namespaces");
  // Two ranks of one host at once, in a new PID (and UTS) namespace; each leaves its
  // stdout in <host>.<rank>.out, its stderr in .err and its exit status in .rc.
  auto host = [&](const Host& h, const std::string& name) {
    std::string script = "hostname " + name + "; ";
    for (int r = 0; r < 2; ++r) {
      const std::string out = (dir / fmt::format("{}.{}", name, r)).string();
      script += fmt::format(
          "(env NEFFCACHE_FAKE_LOG={} NEFFCACHE_FAKE_RATE=0 NEFFCACHE_FAKE_SECONDS=0.5 /usr/bin/python3 {} {} {} {} {} "
          "--arg=-O1 --poll 0.1 >{}.out 2>{}.err; echo $? >{}.rc) & ",
          client_log.string(), test::path::lnl_client, h.mnt().string(), key,
          (test::k_corpus / "spu_credit_fraud_test.hlo.pb").string(), test::path::fake_compiler, out, out, out);
    }
    script += "wait";
    return std::make_unique<test::Child>(
        std::vector<std::string>{"unshare", "--pid", "--fork", "--mount-proc", "--uts", "sh", "-c", script}, true);
  };
  auto on_a = host(a, "node-a"), on_b = host(b, "node-b");
  CHECK(on_a->wait() == 0);
  CHECK(on_b->wait() == 0);
  std::string neff_sha;
  int compiled = 0;
  for (const char* name : {"node-a", "node-b"})
    for (int r = 0; r < 2; ++r) {
      const fs::path out = dir / fmt::format("{}.{}", name, r);
      INFO(name << " rank " << r << ": " << test::slurp(out.string() + ".err"));
      CHECK(test::slurp(out.string() + ".rc") == "0\n");
      auto j = nlohmann::json::parse(test::slurp(out.string() + ".out"), nullptr, false);
      REQUIRE(j.is_object());
      if (neff_sha.empty()) neff_sha = j.value("neff_sha256", "");
      CHECK(j.value("neff_sha256", "") == neff_sha);
      compiled += j.value("outcome", "") == "compiled";
    }
  CHECK(test::count_lines(client_log) == 1);
  CHECK(compiled == 1);  // the others waited, on their host's rank or in their flock, or hit
  CHECK(lnl_compiles(log, key) == 0);  // the daemons compiled nothing of the ranks'
  auto objects = s3->list("");
  REQUIRE(objects.has_value());
  for (const auto& o : objects->objects) {
    INFO(o.key);
    CHECK(o.key.find("compilation_metadata") == std::string::npos);
  }
  // A rank's marker sends its entry up (in the background).
  bool uploaded = false;
  for (int i = 0; i < 600 && !uploaded; ++i) {
    uploaded = s3->head(key + "/.compilation_complete").has_value();
    if (!uploaded) std::this_thread::sleep_for(50ms);
  }
  CHECK(uploaded);
}
