// What the mount tests share: a daemon over a test's own backing folder with the fake
// compiler counting its compiles (on the one fixture of tests/support/mount.hpp), and
// readers in processes of their own.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include <catch2/catch_test_macros.hpp>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/hlo/hlo.hpp>
#include <neffcache/cache/lock.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "hlo_subset.pb.h"
#include "support.hpp"

namespace fusetest {

// What every mount test uses, brought in with `using namespace fusetest`.
using namespace neffcache;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
using test::mounted;
using test::read_all;

using test::k_daemon;
using test::k_fake;

// A daemon mounted for the scope of a test over a backing folder of its own (or a shared
// one), compiling with the fake compiler, which logs each compile; always unmounted
// (lazily) at the end, and its stop checked to be clean.
class Mount {
 public:
  // `env`: NAME=value words for the daemon; `extra`: its options; `launcher` comes
  // before everything (prlimit and the like).
  explicit Mount(std::vector<std::string> env = {}, std::vector<std::string> extra = {},
                 std::optional<fs::path> shared_backing = std::nullopt, std::vector<std::string> launcher = {},
                 const std::string& compiler = k_fake)
      : backing_(shared_backing.value_or(dir_ / "backing")) {
    fs::create_directories(dir_ / "work");
    fs::create_directories(backing());
    test::DaemonSpec spec;
    spec.backing = backing().string();
    spec.mnt = mnt();
    spec.env = {"TMPDIR=" + (dir_ / "work").string(), "NEFFCACHE_FAKE_LOG=" + compile_log().string(),
                "NEFFCACHE_FAKE_RATE=0"};
    spec.env.insert(spec.env.end(), env.begin(), env.end());
    spec.options = {"--compiler", compiler + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}",
                    "-j", "2"};
    spec.options.insert(spec.options.end(), extra.begin(), extra.end());
    spec.launcher = std::move(launcher);
    daemon_.emplace(spec);
  }
  ~Mount() {
    if (auto rc = daemon_->unmount_and_stop()) CHECK(test::MountedDaemon::clean(*rc));
  }
  fs::path backing() const { return backing_; }
  test::MountedDaemon& daemon() { return *daemon_; }
  // Stops the daemon with `sig` and waits for it; the mount may stay behind (kill -9).
  int stop(int sig) { return daemon_->stop(sig); }
  fs::path mnt() const { return dir_ / "mnt"; }
  fs::path compile_log() const { return dir_ / "compiles.log"; }
  int compiles() const { return test::count_lines(compile_log()); }
  // Creates a pending entry in the backing directory; returns its path below the root.
  std::string entry(const std::string& corpus_file, const std::string& name) {
    std::string rel = "neuronxcc-2.21.0/MODULE_" + name;
    fs::create_directories(backing() / rel);
    fs::copy_file(test::k_corpus / corpus_file, backing() / rel / "model.hlo_module.pb");
    return rel;
  }

 private:
  test::TempDir dir_;
  fs::path backing_;
  std::optional<test::MountedDaemon> daemon_;
};

// Opens `path` in a separate process; its exit status says how the open ended
// (0: read a whole fake NEFF, 5: EIO, 4: EINTR, 3: other error, 2: partial NEFF).
inline std::unique_ptr<test::Child> reader_process(const fs::path& path) {
  return std::make_unique<test::Child>(std::vector<std::string>{test::path::reader, path.string()});
}

// Writes a file in place, without fsync: kernel knobs under /proc, large test trees.
inline void write_plain(const fs::path& p, std::string_view bytes) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  REQUIRE(out.good());
}

inline std::string canonical_of(const std::string& corpus_file) {
  return neffcache::analyze_hlo(test::slurp(test::k_corpus / corpus_file))->canonical_sha256;
}

// The neuron-client-sim command line over the corpus graphs `graphs`.
inline std::vector<std::string> client_sim_command(const std::vector<std::string>& graphs) {
  std::vector<std::string> argv{test::path::client_sim, "--json", "--poll", "0.02", "--extract-interval", "0.05",
                                "--compiler", k_fake + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}"};
  for (const auto& g : graphs) argv.push_back((test::k_corpus / g).string());
  return argv;
}

// neuron-client-sim with the cache at `cache` and the fake compiler logging to `log`;
// `env` adds NAME=value words (NEURON_EXTRACT_GRAPHS_ONLY=1 for extraction).
inline std::vector<std::string> client_sim(const fs::path& cache, const fs::path& log, std::vector<std::string> env,
                                           const std::vector<std::string>& graphs) {
  std::vector<std::string> argv{"env", "-u", "NEURON_CC_FLAGS", "-u", "NEURON_EXTRACT_GRAPHS_ONLY",
                                "NEURON_COMPILE_CACHE_URL=" + cache.string(), "NEFFCACHE_FAKE_RATE=0",
                                "NEFFCACHE_FAKE_LOG=" + log.string()};
  argv.insert(argv.end(), env.begin(), env.end());
  auto command = client_sim_command(graphs);
  argv.insert(argv.end(), command.begin(), command.end());
  return argv;
}

// The summary the simulator prints last (--json).
inline nlohmann::json sim_summary(const std::string& output) {
  auto begin = output.find("{\n");
  REQUIRE(begin != std::string::npos);
  return nlohmann::json::parse(output.substr(begin));
}

}  // namespace fusetest
