// The LNL cache (vLLM Neuron, TorchNeuron) through the mount: pending entries show LNL's
// products to a lookup (never in a listing) and compile once on open with their own
// command; a partial entry shows as it is; a client's flock on the key's lock is
// respected; both dialects share one root; nothing of ours is in a key folder.
#include <sys/file.h>

#include <regex>
#include <set>
#include <thread>

#include <neffcache/cache/layout.hpp>

#include "fuse_test.hpp"
#include "lnl.hpp"

using namespace fusetest;  // the library, the mount fixture, chrono literals

namespace {

std::set<std::string> listing(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

}  // namespace

TEST_CASE("a pending LNL entry: its NEFF and marker are found by name, never listed; four readers, one compile with "
          "its own arguments",
          "[fuse][lnl]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=0.5"});
  const std::string key = test::lnl_key("four readers");
  test::make_lnl_entry(m.backing(), "spu_credit_fraud_test.hlo.pb", key, {"--model-type=transformer", "-O1"});
  const auto neff = m.mnt() / key / lnl_neff_name(key);
  CHECK(listing(m.mnt() / key) == listing(m.backing() / key));
  CHECK(fs::exists(neff));
  CHECK(fs::exists(m.mnt() / key / ".compilation_complete"));
  CHECK_FALSE(fs::exists(m.mnt() / key / "model.neff"));
  CHECK(m.compiles() == 0);  // looking compiles nothing

  std::vector<std::pair<int, std::string>> got(4);
  std::vector<std::thread> readers;
  for (auto& g : got) readers.emplace_back([&g, &neff] { g = read_all(neff); });
  for (auto& t : readers) t.join();
  const std::string published = test::slurp(m.backing() / key / lnl_neff_name(key));
  for (const auto& [err, bytes] : got) {
    CHECK(err == 0);
    CHECK(bytes == published);
  }
  CHECK(m.compiles() == 1);
  auto parsed = fake::parse_fake_neff(published);
  REQUIRE(parsed.has_value());
  CHECK(parsed->flags == R"(["--target=trn1", "--model-type=transformer", "-O1"])");
  // LNL's marker, through the mount as in the backing folder, in LNL's format (the time
  // as Python prints time.time()).
  const std::string marker = read_all(m.mnt() / key / ".compilation_complete").second;
  CHECK(marker == test::slurp(m.backing() / key / ".compilation_complete"));
  CHECK(std::regex_match(marker, std::regex(fmt::format("completed:[0-9]+\\.[0-9]+\nneff_size:{}\n", published.size()))));
  CHECK(fs::exists(m.backing() / key / "log-neuron-cc.txt"));
  // Nothing of ours in the key folder: save_cache() copies every file of it.
  CHECK(listing(m.backing() / key) == std::set<std::string>{".artifact_metadata_v0.json", ".compilation_complete",
                                                            "command.txt", "graph.hlo", lnl_neff_name(key),
                                                            "log-neuron-cc.txt"});
  CHECK(read_all(neff).second == published);  // a hit now
  CHECK(m.compiles() == 1);
}

TEST_CASE("LNL's check for the marker compiles a pending entry, and the NEFF is then there", "[fuse][lnl]") {
  Mount m;
  const std::string key = test::lnl_key("marker first");
  test::make_lnl_entry(m.backing(), "gopjrt_tuple.hlo.pb", key);
  auto [err, marker] = read_all(m.mnt() / key / ".compilation_complete");
  CHECK(err == 0);
  CHECK(marker.starts_with("completed:"));
  CHECK(fake::parse_fake_neff(read_all(m.mnt() / key / lnl_neff_name(key)).second).has_value());
  CHECK(m.compiles() == 1);
  // No placeholder for a name that is not this entry's.
  struct stat st {};
  CHECK(::stat((m.mnt() / key / lnl_neff_name(test::lnl_key("other"))).c_str(), &st) != 0);
}

TEST_CASE("a client compiling an LNL entry under the key's flock: no placeholders, and its result wins", "[fuse][lnl]") {
  Mount m;
  const std::string key = test::lnl_key("client compiles");
  test::make_lnl_entry(m.backing(), "gopjrt_tuple.hlo.pb", key);
  // The client, as LNL does it: the per-key lock through the mount, then its compile.
  int fd = ::open((test::lnl_lock(m.mnt(), key)).c_str(), O_RDWR | O_CREAT, 0644);
  REQUIRE(fd >= 0);
  REQUIRE(::flock(fd, LOCK_EX) == 0);
  struct stat st {};
  CHECK(::stat((m.mnt() / key / lnl_neff_name(key)).c_str(), &st) != 0);
  CHECK_FALSE(listing(m.mnt() / key).contains(".compilation_complete"));
  test::spit(m.mnt() / key / lnl_neff_name(key), "the client's NEFF");
  test::spit(m.mnt() / key / ".compilation_complete", lnl_marker(1, 17));
  ::close(fd);
  CHECK(read_all(m.mnt() / key / lnl_neff_name(key)).second == "the client's NEFF");
  CHECK(m.compiles() == 0);
  // Its lock file stays, as the client left it.
  CHECK(fs::exists(test::lnl_lock(m.backing(), key)));
}

TEST_CASE("an LNL entry written through the mount compiles once LNL's metadata is there too, never before",
          "[fuse][lnl]") {
  Mount m;
  const std::string key = test::lnl_key("eager");
  const auto dir = m.mnt() / key;
  fs::create_directories(dir);
  fs::copy_file(test::k_corpus / "spu_tf_jit_comp.hlo.pb", dir / "graph.hlo");
  test::spit(dir / "command.txt", "");  // LNL creates it empty, then writes it
  test::spit(dir / "command.txt", test::lnl_command_text(key, {"-O2"}));
  std::this_thread::sleep_for(300ms);
  // No metadata: a rank's compile in progress (it writes the metadata after its NEFF), not ours.
  CHECK(m.compiles() == 0);
  CHECK_FALSE(listing(dir).contains(".compilation_complete"));
  CHECK_FALSE(fs::exists(own_files((m.backing() / key).string()).failure));
  test::spit(dir / ".artifact_metadata_v0.json", fmt::format(R"({{"cache_key": "{}", "version": 0}})", key));
  auto marker = m.backing() / key / ".compilation_complete";
  for (int i = 0; i < 1000 && !fs::exists(marker); ++i) std::this_thread::sleep_for(10ms);
  CHECK(fs::exists(marker));
  auto neff = fake::parse_fake_neff(test::slurp(m.backing() / key / lnl_neff_name(key)));
  REQUIRE(neff.has_value());
  CHECK(neff->flags == R"(["--target=trn1", "-O2"])");
  CHECK(m.compiles() == 1);
}

TEST_CASE("one root holds both dialects; a partial LNL folder shows as it is, no marker beside a leftover", "[fuse][lnl]") {
  Mount m;
  auto neuron = m.entry("gopjrt_tuple.hlo.pb", "both+0");
  const std::string key = test::lnl_key("partial"), leftover = test::lnl_key("leftover NEFF");
  test::make_lnl_entry(m.backing(), "gopjrt_tuple.hlo.pb", key);
  test::spit(m.backing() / key / "log-neuron-cc.txt", "killed in the middle");
  // A rank that died after its metadata (or while copying its NEFF): LNL's metadata, a
  // leftover NEFF, no marker.
  test::make_lnl_entry(m.backing(), "gopjrt_tuple.hlo.pb", leftover);
  test::spit(m.backing() / leftover / lnl_neff_name(leftover), "5 by.");
  CHECK(fake::parse_fake_neff(read_all(m.mnt() / neuron / "model.neff").second).has_value());
  // A rank's hit test fails, as on a disk: it compiles the key itself, under its lock.
  CHECK(read_all(m.mnt() / key / ".compilation_complete").first == ENOENT);
  CHECK(read_all(m.mnt() / key / lnl_neff_name(key)).first == ENOENT);
  CHECK(read_all(m.mnt() / leftover / ".compilation_complete").first == ENOENT);
  CHECK(read_all(m.mnt() / leftover / lnl_neff_name(leftover)).second == "5 by.");
  CHECK(m.compiles() == 1);
  auto root = listing(m.mnt());
  CHECK(root.contains(key));
  CHECK(root.contains("neuronxcc-2.21.0"));
}

TEST_CASE("a failed LNL compile answers EIO, is recorded in our file, and LNL never sees a marker", "[fuse][lnl]") {
  Mount m({"NEFFCACHE_FAKE_FAIL=1"});
  const std::string key = test::lnl_key("fails");
  test::make_lnl_entry(m.backing(), "gopjrt_tuple.hlo.pb", key);
  CHECK(read_all(m.mnt() / key / ".compilation_complete").first == EIO);
  // Failed now: as on a disk, the entry shows no products (a rank that looks next finds no
  // hit and compiles it itself).
  CHECK(read_all(m.mnt() / key / lnl_neff_name(key)).first == ENOENT);
  CHECK(m.compiles() == 1);
  // Our record, outside the key folder (own_files), which holds LNL's inputs alone.
  CHECK(test::slurp(own_files((m.backing() / key).string()).failure).find("injected") != std::string::npos);
  CHECK(listing(m.backing() / key) == std::set<std::string>{".artifact_metadata_v0.json", "command.txt", "graph.hlo"});
}

TEST_CASE("vLLM Neuron clients on the mount: each graph compiled once, by the daemon or by a client", "[fuse][lnl]") {
  Mount m({"NEFFCACHE_FAKE_SECONDS=0.3"});
  test::TempDir vllm;
  // $VLLM_CACHE_ROOT/neuron/compile_cache is the mount.
  fs::create_directories(vllm / "neuron");
  fs::create_directory_symlink(m.mnt(), vllm / "neuron" / "compile_cache");
  const std::vector<std::string> graphs{"spu_tf_jit_comp.hlo.pb", "rocm08_normal_9.hlo_proto.pb"};
  std::vector<std::unique_ptr<test::Child>> ranks;
  for (int r = 0; r < 3; ++r) {
    std::vector<std::string> argv{"env", "VLLM_CACHE_ROOT=" + vllm.path().string(), "NEFFCACHE_FAKE_RATE=0",
                                  "NEFFCACHE_FAKE_SECONDS=0.3", "NEFFCACHE_FAKE_LOG=" + m.compile_log().string(),
                                  test::path::client_sim, "--dialect", "lnl", "--json", "--poll", "0.05", "--compiler",
                                  k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}"};
    for (const auto& g : graphs) argv.push_back((test::k_corpus / g).string());
    ranks.push_back(std::make_unique<test::Child>(argv, true));
  }
  for (auto& r : ranks) {
    auto out = r->rest();
    CHECK(r->wait() == 0);
    CHECK(out.find("\"failed\": 0") != std::string::npos);
  }
  // Each graph compiled once, by the rank that took its lock; the daemon compiled nothing
  // (a rank writes LNL's metadata after its NEFF: until then the entry is no job of ours).
  CHECK(test::count_lines(m.compile_log()) == 2);
  int done = 0;
  for (const auto& e : fs::directory_iterator(m.backing()))
    if (e.is_directory() && is_lnl_key(e.path().filename().string()))
      done += fs::exists(e.path() / ".compilation_complete");
  CHECK(done == 2);
}
