// neffcachefs over an s3:// cache, mounted for real against radosgw: done entries
// fetched once into the local tier, HLOs written through the mount uploaded and
// compiled, several daemons over one bucket compiling each entry once, a killed
// daemon's compile finished by another, and the local tier kept under its cap.
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/tier.hpp>
#include <neffcache/store/metrics.hpp>

#include "metrics.hpp"
#include "nki.hpp"
#include "s3_mount.hpp"
#include "s3_support.hpp"
#include "support.hpp"

using namespace s3test;  // the library, chrono literals, ContainsSubstring, fs, k_fake_template

namespace {

using test::S3Mount;

using test::k_daemon;
const std::string k_compiler_dir = "neuronxcc-2.21.0";

std::string mount_rel_of(int i) { return test::fake_entry(i, 2000); }

using test::mounted;
using test::read_all;

void put_pending(S3Client& s3, int n) { test::put_pending_entries(s3, "", n, 2000); }

// Stores the pending entry `rel` with the inputs of the first put_pending entry: the same
// graph and flags under another name (another client, another path).
void put_twin_of_first(S3Client& s3, const std::string& rel) {
  for (const char* name : {"compile_flags.json", "model.hlo_module.pb"})
    REQUIRE(s3.put(fmt::format("{}/{}", rel, name), *s3.get(fmt::format("{}/{}", mount_rel_of(0), name))).has_value());
}

std::string random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 gen(seed);
  std::string out(n, '\0');
  for (auto& c : out) c = static_cast<char>(gen());
  return out;
}

bool has_object(S3Client& s3, const std::string& key) { return s3.head(key).has_value(); }


}  // namespace

TEST_CASE("an s3:// mount fetches a done entry once for concurrent readers, then serves it from disk",
          "[s3][mount]") {
  auto s3 = test::fresh_bucket("mountfetch");
  put_pending(*s3, 1);
  const std::string neff = random_bytes(3 << 20, 7);
  REQUIRE(s3->put(mount_rel_of(0) + "/model.neff", neff).has_value());
  REQUIRE(s3->put(mount_rel_of(0) + "/model.done", "").has_value());
  test::TempDir dir;
  S3Mount m(fmt::format("s3://{}", s3->bucket()), dir / "compiles.log");

  // Names come from S3 as they are asked for: a listing of the root, then the entry.
  std::vector<std::string> roots;
  for (const auto& e : fs::directory_iterator(m.mnt())) roots.push_back(e.path().filename().string());
  CHECK(std::find(roots.begin(), roots.end(), k_compiler_dir) != roots.end());

  const fs::path path = m.mnt() / mount_rel_of(0) / "model.neff";
  std::vector<std::pair<int, std::string>> got(8);
  std::vector<std::thread> readers;
  for (auto& g : got) readers.emplace_back([&g, path] { g = read_all(path); });
  for (auto& t : readers) t.join();
  for (const auto& [err, bytes] : got) {
    CHECK(err == 0);
    CHECK(bytes == neff);
  }
  auto stats = m.stats();
  INFO(stats.dump());
  CHECK(stats["s3"]["fetches"] == 1);
  CHECK(stats["s3"]["fetched_bytes"] == neff.size());
  CHECK(test::slurp(m.local() / mount_rel_of(0) / "model.neff") == neff);
  CHECK(fs::exists(m.local() / mount_rel_of(0) / "model.done"));
  CHECK_FALSE(fs::exists(dir / "compiles.log"));  // nothing compiled

  // Later opens are served from the local tier: no new fetch.
  for (int i = 0; i < 3; ++i) CHECK(read_all(path).second == neff);
  stats = m.stats();
  CHECK(stats["s3"]["fetches"] == 1);
  CHECK(stats["hits"].get<int>() >= 3);
  // A name S3 does not have stays missing.
  CHECK_FALSE(fs::exists(m.mnt() / k_compiler_dir / "MODULE_404+4f2d9c1a"));

  // The S3 metrics (docs/METRICS.md), each with its type, which only a bucket mount shows.
  auto tool = test::run_tool({"stats", "--cache", m.mnt().string(), "--format", "prometheus"});
  REQUIRE(tool.exit_code == 0);
  const auto metrics = test::parse_metrics(tool.output);
  for (const auto& spec : store::daemon_metrics())
    if (std::string name(spec.name); name.starts_with("neffcache_s3_")) {
      INFO(name);
      CHECK((metrics.types.count(name) == 1 && metrics.types.at(name) == spec.type));
    }
  CHECK(metrics.value("neffcache_s3_fetches_total") == 1);
  CHECK(metrics.value("neffcache_s3_fetched_bytes_total") == static_cast<double>(neff.size()));
  CHECK(metrics.value("neffcache_s3_requests_total") >= 3);  // lists, the lease-less fetch's HEAD and GET
  // 404s of names S3 lacks are answers, not errors: errors here are only transient ones retried.
  CHECK(metrics.value("neffcache_s3_request_errors_total") <= metrics.value("neffcache_s3_retries_total"));
  auto checked = test::promtool_check(tool.output, dir.path());
  INFO(checked.output);
  CHECK(checked.exit_code == 0);
}

TEST_CASE("an HLO written through an s3:// mount is uploaded, compiled once, and published NEFF first",
          "[s3][mount]") {
  auto s3 = test::fresh_bucket("mountwrite");
  test::TempDir dir;
  const fs::path log = dir / "compiles.log";
  S3Mount m(fmt::format("s3://{}/team", s3->bucket()), log);
  const fs::path entry = m.mnt() / mount_rel_of(0);
  fs::create_directories(entry);
  test::spit(entry / "compile_flags.json", R"(["--target=trn1"])");
  fs::copy_file(test::corpus_files()[0], entry / "model.hlo_module.pb");
  auto [err, bytes] = read_all(entry / "model.neff");
  REQUIRE(err == 0);
  CHECK_FALSE(bytes.empty());

  const std::string base = "team/" + mount_rel_of(0);
  CHECK(s3->get(base + "/model.hlo_module.pb").value() == test::slurp(test::corpus_files()[0]));
  CHECK(s3->get(base + "/compile_flags.json").value() == R"(["--target=trn1"])");
  CHECK(s3->get(base + "/model.neff").value() == bytes);
  CHECK(has_object(*s3, base + "/model.done"));
  CHECK_FALSE(has_object(*s3, base + "/model.hlo_module.pb.lock"));  // done: the lease is gone
  CHECK(test::count_lines(log) == 1);
  // The NEFF compiled here stays here; nothing was fetched.
  auto stats = m.stats();
  CHECK(stats["s3"]["fetches"] == 0);
  CHECK(stats["s3"]["uploads"] == 1);
  CHECK(test::slurp(m.local() / mount_rel_of(0) / "model.neff") == bytes);
}

TEST_CASE("without eager compiles, HLOs written or renamed into an s3:// mount are still uploaded", "[s3][mount]") {
  auto s3 = test::fresh_bucket("mountlazy");
  test::TempDir dir;
  S3Mount m(fmt::format("s3://{}", s3->bucket()), dir / "compiles.log", {"--no-eager"});
  const fs::path entry = m.mnt() / mount_rel_of(0);
  fs::create_directories(entry);
  fs::copy_file(test::corpus_files()[1], entry / "model.hlo_module.pb");
  bool up = false;
  for (int i = 0; i < 200 && !(up = has_object(*s3, mount_rel_of(0) + "/model.hlo_module.pb")); ++i)
    std::this_thread::sleep_for(50ms);
  CHECK(up);
  // Written as neffcache put writes (a temporary file renamed into place): uploaded too.
  auto put = test::run({"env", "-u", "NEURON_CC_FLAGS", "NEURON_COMPILE_CACHE_URL=" + m.mnt().string(), test::k_tool,
                        "put", "--compiler-version", "2.21.0", test::corpus_files()[2].string()});
  REQUIRE(put.exit_code == 0);
  // It prints the entry's folder in the mount.
  std::string key = put.output.substr(m.mnt().string().size() + 1, put.output.find('\n') - m.mnt().string().size() - 1);
  bool renamed_up = false;
  for (int i = 0; i < 200 && !(renamed_up = has_object(*s3, key + "/model.hlo_module.pb")); ++i)
    std::this_thread::sleep_for(50ms);
  CHECK(renamed_up);
  CHECK_FALSE(fs::exists(dir / "compiles.log"));
  CHECK_FALSE(has_object(*s3, mount_rel_of(0) + "/model.neff"));
}

TEST_CASE("three daemons over one bucket compile each entry once for many readers", "[s3][mount]") {
  auto s3 = test::fresh_bucket("threedaemons");
  const int n = 6;
  put_pending(*s3, n);
  test::TempDir dir;
  const fs::path log = dir / "compiles.log";
  const std::vector<std::string> env = test::exclusive_compile_env(dir / "exclusive");
  const std::string url = fmt::format("s3://{}", s3->bucket());
  std::vector<std::unique_ptr<S3Mount>> mounts;
  for (int d = 0; d < 3; ++d) mounts.push_back(std::make_unique<S3Mount>(url, log, std::vector<std::string>{}, env));

  // Two readers of every entry through every mount, all at once.
  struct Read {
    int mount, entry, err = -1;
    std::string bytes = {};
  };
  std::vector<Read> reads;
  for (int d = 0; d < 3; ++d)
    for (int e = 0; e < n; ++e)
      for (int k = 0; k < 2; ++k) reads.push_back({d, e});
  std::vector<std::thread> threads;
  for (auto& r : reads)
    threads.emplace_back([&r, &mounts] {
      std::tie(r.err, r.bytes) = read_all(mounts[static_cast<std::size_t>(r.mount)]->mnt() / mount_rel_of(r.entry) / "model.neff");
    });
  for (auto& t : threads) t.join();

  std::map<int, std::string> neff_of;
  for (const auto& r : reads) {
    INFO("mount " << r.mount << " entry " << r.entry);
    CHECK(r.err == 0);
    CHECK_FALSE(r.bytes.empty());
    auto [it, first] = neff_of.emplace(r.entry, r.bytes);
    CHECK(it->second == r.bytes);  // one NEFF per entry, whichever daemon compiled it
  }
  test::check_compiled_once(log, dir / "exclusive", n);
  for (int e = 0; e < n; ++e) CHECK(s3->get(mount_rel_of(e) + "/model.neff").value() == neff_of[e]);
}

TEST_CASE("a daemon killed mid-compile loses its S3 lease and another daemon finishes the entry", "[s3][mount]") {
  auto s3 = test::fresh_bucket("killeddaemon");
  put_pending(*s3, 1);
  test::TempDir dir;
  const fs::path slow_log = dir / "slow.log", log = dir / "compiles.log";
  const std::string url = fmt::format("s3://{}", s3->bucket());
  const std::vector<std::string> ttl{"--lease-ttl", "2"};
  auto slow = std::make_unique<S3Mount>(url, slow_log, ttl,
                                        std::vector<std::string>{"NEFFCACHE_FAKE_SECONDS=60", "NEFFCACHE_FAKE_IDLE=1"});
  S3Mount other(url, log, ttl);

  // A reader starts the compile on the slow daemon; its lease appears.
  test::Child reader({"cat", (slow->mnt() / mount_rel_of(0) / "model.neff").string()});
  const std::string lease_key = mount_rel_of(0) + "/model.hlo_module.pb.lock";
  bool leased = false;
  for (int i = 0; i < 200 && !(leased = has_object(*s3, lease_key) && fs::exists(slow_log)); ++i)
    std::this_thread::sleep_for(50ms);
  REQUIRE(leased);
  auto before = read_lease(*s3, lease_key);
  REQUIRE(before.has_value());
  CHECK_FALSE(before->expired);

  slow->kill9();
  // Its compiler outlives it (nothing tells it the daemon died): stop it too, as an
  // operator would; its lease is what matters here.
  std::istringstream line(test::slurp(slow_log));
  pid_t compiler = 0;
  line >> compiler;
  if (compiler > 0) ::kill(compiler, SIGKILL);
  CHECK(reader.wait() != 0);

  auto t0 = std::chrono::steady_clock::now();
  auto [err, bytes] = read_all(other.mnt() / mount_rel_of(0) / "model.neff");
  auto waited = std::chrono::steady_clock::now() - t0;
  CHECK(err == 0);
  CHECK_FALSE(bytes.empty());
  CHECK(test::count_lines(log) == 1);  // the other daemon compiled it
  CHECK(waited < 60s);                 // by taking the lease over, not by outwaiting the slow compile
  CHECK(s3->get(mount_rel_of(0) + "/model.neff").value() == bytes);
  CHECK(has_object(*s3, mount_rel_of(0) + "/model.done"));
}

TEST_CASE("neuron_parallel_compile on an s3:// mount: the graphs go to the bucket and compile there", "[s3][mount]") {
  auto s3 = test::fresh_bucket("mountnpc");
  test::TempDir dir;
  const fs::path log = dir / "compiles.log";
  S3Mount m(fmt::format("s3://{}", s3->bucket()), log);
  // A trial run that writes two graphs into the cache, as graph extraction does.
  std::string body = "#!/bin/sh\n";
  for (int i : {0, 1})
    body += fmt::format(
        "p=$('{}' put --compiler-version 2.21.0 '{}') || exit 9\n"
        "echo \"INFO ||NEURON_CC_WRAPPER||: Extracting graphs ($p/model.hlo_module.pb) for ahead-of-time parallel "
        "compilation. No compilation was done.\"\n",
        test::k_tool, test::corpus_files()[static_cast<std::size_t>(i)].string());
  test::spit(dir / "train.sh", body);
  fs::permissions(dir / "train.sh", fs::perms::owner_all);
  // The tool's own compiler does not exist: every compile must be the daemon's.
  auto r = test::run(test::s3_tool_argv({"--compiler", "no-such-cc {hlo} {neff}", (dir / "train.sh").string()},
                                        {"NEURON_COMPILE_CACHE_URL=" + m.mnt().string()}, test::path::npc));
  INFO(r.output);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.output, ContainsSubstring("Total successful compilations: 2"));
  CHECK(test::count_lines(log) == 2);
  auto listing = s3->list("");
  REQUIRE(listing.has_value());
  int done = 0;
  for (const auto& o : listing->objects) done += o.key.ends_with("/model.done");
  CHECK(done == 2);
}

TEST_CASE("neffcachefs refuses a bad s3:// set-up with one line", "[s3][mount]") {
  auto s3 = test::fresh_bucket("mountbad");
  test::TempDir dir;
  fs::create_directories(dir / "mnt");
  const std::string url = fmt::format("s3://{}", s3->bucket());
  auto no_local = test::run(test::s3_tool_argv({"-f", url, (dir / "mnt").string()}, {}, k_daemon));
  test::check_one_line_error(no_local, "--local-cache", "neffcachefs");
  auto wrong = test::run(test::s3_tool_argv({"-f", "--local-cache", (dir / "local").string(), url, (dir / "mnt").string()},
                                            {"AWS_SECRET_ACCESS_KEY=wrong"}, k_daemon));
  test::check_one_line_error(wrong, "SignatureDoesNotMatch", "neffcachefs");
  auto dir_backing = test::run(test::s3_tool_argv(
      {"-f", "--local-cache", (dir / "local").string(), dir.path().string(), (dir / "mnt").string()}, {}, k_daemon));
  test::check_one_line_error(dir_backing, "--local-cache is for an s3:// cache", "neffcachefs");
  CHECK_FALSE(mounted(dir / "mnt"));
}

TEST_CASE("the local tier keeps its NEFFs under the cap, least recently used leaving first", "[s3][mount]") {
  auto s3 = test::fresh_bucket("tiercap");
  put_pending(*s3, 3);
  for (int i = 0; i < 3; ++i) {
    REQUIRE(s3->put(mount_rel_of(i) + "/model.neff", random_bytes(1000, static_cast<unsigned>(i))).has_value());
    REQUIRE(s3->put(mount_rel_of(i) + "/model.done", "").has_value());
  }
  test::TempDir dir;
  S3Tier::Options o;
  o.root = dir.path().string();
  o.cap_bytes = 2000;
  o.keep_after_use = 0s;
  auto url = parse_cache_url(fmt::format("s3://{}", s3->bucket()));
  auto client = S3Client::open(*url, test::S3Env{}.lookup());
  REQUIRE(client.has_value());
  S3Tier tier(std::move(*client), o);
  auto entry = [&](int i) { return (dir / mount_rel_of(i)).string(); };
  CompileSettings s;
  for (int i = 0; i < 3; ++i) {
    REQUIRE(tier.fill((dir / k_compiler_dir).string(), fs::path(mount_rel_of(i)).filename().string()));
    if (i == 2) tier.opened(entry(0));  // 0 read again: 1 is now the least recently used
    CHECK(is_success(tier.settle(entry(i), s).outcome));
    std::this_thread::sleep_for(10ms);
  }
  CHECK(fs::exists(fs::path(entry(0)) / "model.neff"));
  CHECK_FALSE(fs::exists(fs::path(entry(1)) / "model.neff"));  // evicted
  CHECK_FALSE(fs::exists(fs::path(entry(1)) / "model.done"));
  CHECK(fs::exists(fs::path(entry(1)) / "model.hlo_module.pb"));  // pending again here
  CHECK(fs::exists(fs::path(entry(2)) / "model.neff"));
  CHECK(tier.stats()["evictions"] == 1);
  CHECK(has_object(tier.s3(), mount_rel_of(1) + "/model.neff"));  // S3 keeps it
  // Asked for again, it is fetched again.
  CHECK(is_success(tier.settle(entry(1), s).outcome));
  CHECK(fs::file_size(fs::path(entry(1)) / "model.neff") == 1000);
  CHECK(tier.stats()["fetches"] == 4);
}

TEST_CASE("a bucket as a read-only layer (--lower s3://): its done entries are fetched, the rest compiles into the local "
          "folder, and nothing is written to the bucket",
          "[s3][mount][layers]") {
  auto s3 = test::fresh_bucket("lowerbucket");
  put_pending(*s3, 2);
  const std::string neff = random_bytes(1 << 20, 11);
  REQUIRE(s3->put(mount_rel_of(0) + "/model.neff", neff).has_value());
  REQUIRE(s3->put(mount_rel_of(0) + "/model.done", "").has_value());
  // A pending graph calling an NKI kernel that the bucket has and this host lacks.
  test::TempDir dir;
  const fs::path kernels = dir / "nki", kernel = kernels / "ab" / "k.klir";
  REQUIRE(s3->put(mount_rel_of(2) + "/compile_flags.json", R"(["--target=trn1"])").has_value());
  REQUIRE(s3->put(mount_rel_of(2) + "/model.hlo_module.pb", test::graph_calling(kernel.string())).has_value());
  REQUIRE(s3->put(".neffcache/nki-kernels/ab/k.klir", "a kernel binary").has_value());
  auto objects = [&] {
    auto l = s3->list("");
    REQUIRE(l.has_value());
    std::map<std::string, std::string> out;
    for (const auto& o : l->objects) out[o.key] = o.etag;
    return out;
  };
  const auto before = objects();
  const fs::path log = dir / "compiles.log";
  const std::string fresh = k_compiler_dir + "/MODULE_9999+4f2d9c1a";
  {
    S3Mount m(fmt::format("s3://{}", s3->bucket()), log, {"--nki-kernels", kernels.string()}, {},
              test::BucketAs::lower);
    // Done in the bucket: fetched into the local folder.
    auto got = read_all(m.mnt() / mount_rel_of(0) / "model.neff");
    CHECK(got.first == 0);
    CHECK(got.second == neff);
    // Pending in the bucket: compiled here, once, and kept here.
    CHECK(read_all(m.mnt() / mount_rel_of(1) / "model.neff").first == 0);
    CHECK(test::count_lines(log) == 1);
    CHECK(fs::exists(m.local() / mount_rel_of(1) / "model.done"));
    // A graph the bucket does not have, written through the mount: compiled here.
    REQUIRE(fs::create_directory(m.mnt() / fresh));
    test::spit(m.mnt() / fresh / "compile_flags.json", R"(["--target=trn1"])");
    fs::copy_file(test::corpus_files()[5], m.mnt() / fresh / "model.hlo_module.pb");
    CHECK(read_all(m.mnt() / fresh / "model.neff").first == 0);
    CHECK(test::count_lines(log) == 2);
    CHECK(fs::exists(m.local() / fresh / "model.done"));
    // The kernel comes from the bucket before the compile here.
    CHECK(read_all(m.mnt() / mount_rel_of(2) / "model.neff").first == 0);
    CHECK(test::slurp(kernel) == "a kernel binary");
    CHECK(test::count_lines(log) == 3);
    auto stats = m.stats();
    CHECK(stats["s3"]["read_only"] == true);
    CHECK(stats["s3"]["uploads"] == 0);
    CHECK(stats["s3"]["fetches"] == 1);
    // The bucket is as it was: no input, no lease, no result.
    CHECK(objects() == before);
  }
  // Refused in one line: a bucket is the only layer under its local folder.
  auto r = test::run({"env", k_daemon, "--lower", fmt::format("s3://{}", s3->bucket()), "--upper", dir.path().string(),
                      (dir / "x").string(), (dir / "y").string()});
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.output, ContainsSubstring("is the only layer under BACKING"));
}

TEST_CASE("a graph one daemon compiled is served by another daemon to an entry of another name, without a compile",
          "[s3][mount][index]") {
  auto s3 = test::fresh_bucket("twinhosts");
  // Two pending entries of one graph and flags under two names (two clients, two paths).
  put_pending(*s3, 1);
  const std::string twin = fmt::format("{}/MODULE_2999+4f2d9c1a", k_compiler_dir);
  put_twin_of_first(*s3, twin);
  test::TempDir dir;
  const fs::path log = dir / "compiles.log";
  const std::string url = fmt::format("s3://{}", s3->bucket());
  std::string first;
  {
    S3Mount host_a(url, log);
    auto [err, bytes] = read_all(host_a.mnt() / mount_rel_of(0) / "model.neff");
    REQUIRE(err == 0);
    first = bytes;
  }
  REQUIRE(test::count_lines(log) == 1);
  S3Mount host_b(url, log);
  auto [err, bytes] = read_all(host_b.mnt() / twin / "model.neff");
  CHECK(err == 0);
  CHECK(bytes == first);
  CHECK(test::count_lines(log) == 1);  // served from the bucket's index: no compile on host B
  CHECK(s3->get(twin + "/model.neff").value() == first);
  CHECK(host_b.stats()["twins"]["served"] == 1);
}

TEST_CASE("a twin whose original this host holds is linked, not fetched; the bucket's entry is done for every host",
          "[s3][mount][index]") {
  auto s3 = test::fresh_bucket("twinlink");
  put_pending(*s3, 1);
  const std::string twin = fmt::format("{}/MODULE_2998+4f2d9c1a", k_compiler_dir);
  const std::string later = fmt::format("{}/MODULE_2997+4f2d9c1a", k_compiler_dir);
  for (const auto& rel : {twin, later}) put_twin_of_first(*s3, rel);
  test::TempDir dir;
  const fs::path log = dir / "compiles.log";
  const std::string url = fmt::format("s3://{}", s3->bucket());
  S3Mount host(url, log);
  auto [err, first] = read_all(host.mnt() / mount_rel_of(0) / "model.neff");
  REQUIRE(err == 0);
  // The twin's open: served in the bucket (CopyObject, for other hosts), linked here.
  auto [err2, bytes] = read_all(host.mnt() / twin / "model.neff");
  CHECK(err2 == 0);
  CHECK(bytes == first);
  CHECK(test::count_lines(log) == 1);
  CHECK(s3->head(twin + "/model.done").has_value());
  CHECK(s3->get(twin + "/model.neff").value() == first);
  auto inode = [&](const std::string& rel) {
    struct stat st {};
    return ::stat((host.local() / rel / "model.neff").c_str(), &st) == 0 ? st.st_ino : 0;
  };
  CHECK(inode(twin) == inode(mount_rel_of(0)));
  // Another host made a third name a twin in the bucket: this host links it too.
  {
    S3Mount other(url, log);
    REQUIRE(read_all(other.mnt() / later / "model.neff").first == 0);
  }
  CHECK(read_all(host.mnt() / later / "model.neff").second == first);
  CHECK(inode(later) == inode(mount_rel_of(0)));
  CHECK(test::count_lines(log) == 1);
  CHECK(host.stats()["s3"]["fetches"] == 0);
}

TEST_CASE("a host warmed from another host's manifest serves the entries it lists from disk, with no fetch at open",
          "[s3][mount][warm]") {
  auto s3 = test::fresh_bucket("warm");
  const int n = 4;
  put_pending(*s3, n);
  for (int i = 0; i < n; ++i) {  // done, as another host published them
    REQUIRE(s3->put(mount_rel_of(i) + "/model.neff", random_bytes(1000u * static_cast<unsigned>(i + 1), i)).has_value());
    REQUIRE(s3->put(mount_rel_of(i) + "/model.done", "").has_value());
  }
  test::TempDir dir;
  const fs::path log = dir / "compiles.log", manifest = dir / "manifest.json";
  const std::string url = fmt::format("s3://{}", s3->bucket());
  {
    S3Mount host_a(url, log);
    for (int i = 0; i < 3; ++i) REQUIRE(read_all(host_a.mnt() / mount_rel_of(i) / "model.neff").first == 0);
    auto made = test::run({test::k_tool, "manifest", "--cache", host_a.mnt().string(), "-o", manifest.string()});
    INFO(made.output);
    REQUIRE(made.exit_code == 0);
  }
  auto m = nlohmann::json::parse(test::slurp(manifest));
  CHECK(m["bucket"] == url);
  REQUIRE(m["entries"].size() == 3);
  CHECK(m["entries"][0]["entry"] == mount_rel_of(2));  // largest first
  CHECK(m["entries"][0]["neff_bytes"] == 3000);

  std::string warmed;
  S3Mount host_b(url, log, {}, {}, test::BucketAs::cache, [&](const fs::path& local) {
    auto r = test::run(test::s3_tool_argv({"warm", manifest.string(), "--local-cache", local.string()}));
    warmed = r.output;
    CHECK(r.exit_code == 0);
  });
  INFO(warmed);
  CHECK_THAT(warmed, ContainsSubstring("warm: 3 entries fetched"));
  for (int i = 0; i < 3; ++i) {
    auto [err, bytes] = read_all(host_b.mnt() / mount_rel_of(i) / "model.neff");
    CHECK(err == 0);
    CHECK(bytes == random_bytes(1000u * static_cast<unsigned>(i + 1), i));
  }
  CHECK(host_b.stats()["s3"]["fetches"] == 0);  // all from disk
  // An entry the manifest did not list is still fetched at its open.
  CHECK(read_all(host_b.mnt() / mount_rel_of(3) / "model.neff").first == 0);
  CHECK(host_b.stats()["s3"]["fetches"] == 1);

  SECTION("a damaged manifest is refused with one line and fetches nothing") {
    test::spit(dir / "bad.json", R"({"manifest": 1, "entries": [{"entry": "../../etc"}]})");
    test::TempDir other;
    auto r = test::run(test::s3_tool_argv({"warm", (dir / "bad.json").string(), "--cache", url, "--local-cache",
                                           other.path().string()}));
    CHECK(r.exit_code == 1);
    CHECK_THAT(r.output, ContainsSubstring("not an entry path"));
    CHECK(fs::is_empty(other.path()));
  }
}

TEST_CASE("a bucket mount that waits for a compile farm compiles nothing: its open returns the farm's NEFF",
          "[s3][mount][farm]") {
  auto s3 = test::fresh_bucket("waitfarm");
  put_pending(*s3, 1);
  test::TempDir dir;
  const fs::path mount_log = dir / "mount-compiles.log", farm_log = dir / "farm-compiles.log";
  const std::string url = fmt::format("s3://{}", s3->bucket());
  S3Mount host(url, mount_log, {"--wait-for-farm"});
  std::pair<int, std::string> got{-1, ""};
  std::thread reader([&] { got = read_all(host.mnt() / mount_rel_of(0) / "model.neff"); });
  // A graph written through the mount goes up for the farm, and is not compiled here either.
  const std::string written = fmt::format("{}/MODULE_2900+4f2d9c1a", k_compiler_dir);
  fs::create_directories(host.mnt() / written);
  test::spit(host.mnt() / written / "compile_flags.json", R"(["--target=trn1"])");
  test::spit(host.mnt() / written / "model.hlo_module.pb", test::slurp(test::corpus_files()[1]));
  bool up = false;
  for (int i = 0; i < 200 && !(up = has_object(*s3, written + "/model.hlo_module.pb")); ++i)
    std::this_thread::sleep_for(50ms);
  CHECK(up);
  std::this_thread::sleep_for(1s);
  CHECK(test::count_lines(mount_log) == 0);
  CHECK(host.stats()["waiters"] == 1);  // the reader still waits
  // The farm (one pass of neffcache compile here) compiles both; the reader gets its NEFF.
  auto farm = test::run(test::s3_tool_argv({"compile", "--cache", url, "--compiler", k_fake_template},
                                           {"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_LOG=" + farm_log.string()}));
  INFO(farm.output);
  CHECK(farm.exit_code == 0);
  reader.join();
  CHECK(got.first == 0);
  CHECK(got.second == s3->get(mount_rel_of(0) + "/model.neff").value());
  CHECK(test::count_lines(farm_log) == 2);
  CHECK(test::count_lines(mount_log) == 0);
}
