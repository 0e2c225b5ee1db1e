// Helpers shared by the tests: the corpus, temporary folders, running the tool.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <fmt/format.h>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/clock.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/core/detail/process.hpp>
#include <neffcache/cache/url.hpp>

#include "mount.hpp"
#include "paths.hpp"
#include "process.hpp"

namespace test {

namespace fs = std::filesystem;

inline const fs::path k_corpus = test::path::corpus;
inline const fs::path k_data = test::path::data;
inline const std::string k_tool = test::path::tool;
inline const std::string k_fake = test::path::fake_compiler;
inline const std::string k_sim = test::path::client_sim;
inline const std::string k_daemon = test::path::daemon;
// The version the fake compiler reports in the tests (NEFFCACHE_FAKE_VERSION, which each test
// process sets for itself and what it starts: paths.cpp.in), and so the compiler folder
// whose entries it may compile (compiler_serves).
inline constexpr std::string_view k_fake_version = "2.21.0";
inline const std::string k_fake_dir = "neuronxcc-2.21.0";
// The fake compiler as a compile template (tools' --compiler, the daemon's).
inline const std::string k_fake_template =
    std::string(test::path::fake_compiler) + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}";

// Every serialized HLO file of the corpus, sorted by name.
inline std::vector<fs::path> corpus_files() {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(k_corpus))
    if (e.path().extension() == ".pb") out.push_back(e.path());
  std::sort(out.begin(), out.end());
  REQUIRE(out.size() >= 25);
  return out;
}

inline std::string slurp(const fs::path& p) {
  auto r = neffcache::detail::read_file(p.string());
  REQUIRE(r.has_value());
  return std::move(*r);
}

inline void spit(const fs::path& p, std::string_view bytes) {
  fs::create_directories(p.parent_path());
  auto r = neffcache::detail::write_file_atomic(p.string(), bytes);
  REQUIRE(r.has_value());
}

// Every name below `dir` (links not followed) with its type, mode and bytes: two equal
// snapshots mean nothing in the tree was added, removed or changed.
inline std::map<std::string, std::string> snapshot_tree(const fs::path& dir) {
  std::map<std::string, std::string> names;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    struct stat st {};
    REQUIRE(::lstat(e.path().c_str(), &st) == 0);
    std::string what = fmt::format("{:o} ", st.st_mode);
    if (S_ISREG(st.st_mode)) what += slurp(e.path());
    else if (S_ISLNK(st.st_mode)) what += fs::read_symlink(e.path()).string();
    names[fs::relative(e.path(), dir).string()] = std::move(what);
  }
  return names;
}

// The names in the folder `dir` (not below it).
inline std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// Creates an empty file (no fsync: for building large test trees quickly).
inline void touch(const fs::path& p) {
  int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  REQUIRE(fd >= 0);
  ::close(fd);
}

// A fresh folder under $TMPDIR, removed with everything in it at scope end.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (fs::temp_directory_path() / "neffcache-test-XXXXXX").string();
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const fs::path& path() const { return path_; }
  fs::path operator/(const std::string& name) const { return path_ / name; }

 private:
  fs::path path_;
};

// A fresh tmpfs of `size` (as mount takes it: "2m"), for full-disk tests; lazily
// unmounted and removed at scope end. Needs root, as the CI machines give.
class Tmpfs {
 public:
  explicit Tmpfs(const std::string& size) {
    REQUIRE(::mount("tmpfs", dir_.path().c_str(), "tmpfs", MS_NOSUID | MS_NODEV, ("size=" + size).c_str()) == 0);
  }
  ~Tmpfs() { ::umount2(dir_.path().c_str(), MNT_DETACH); }
  const fs::path& path() const { return dir_.path(); }
  fs::path operator/(const std::string& name) const { return dir_ / name; }

 private:
  TempDir dir_;
};

struct ToolRun {
  int exit_code;
  std::string output;
};

// Runs a command with stdout and stderr merged; argv[0] is looked up on PATH. `limit`: a
// guard against a hang, never a timing goal (those belong in bench/).
inline ToolRun run(const std::vector<std::string>& argv, std::chrono::seconds limit = std::chrono::seconds(60)) {
  auto r = neffcache::detail::run_capture(argv, limit);
  REQUIRE(r.has_value());
  return {r->exit_code, r->output};
}

// A fresh ext4 file system in memory (an image on a tmpfs, mounted through a loop
// device): ext4's hashed folders and journal at the speed of memory, for tests that make
// tens of thousands of names. Needs root, as the CI machines give.
class Ext4Image {
 public:
  Ext4Image(const std::string& size, int inodes) : image_(size) {
    const std::string file = (image_ / "ext4.img").string();
    REQUIRE(run({"truncate", "-s", size, file}).exit_code == 0);
    REQUIRE(run({"mkfs.ext4", "-q", "-N", std::to_string(inodes), file}).exit_code == 0);
    REQUIRE(run({"mount", "-o", "loop", file, dir_.path().string()}).exit_code == 0);
  }
  ~Ext4Image() { ::umount2(dir_.path().c_str(), MNT_DETACH); }  // (frees the loop device)
  const fs::path& path() const { return dir_.path(); }
  fs::path operator/(const std::string& name) const { return dir_ / name; }

 private:
  Tmpfs image_;
  TempDir dir_;
};

// Runs `neffcache` with a clean Neuron environment (no NEURON_CC_FLAGS, cache URL or
// retries from the caller), the fake compiler at full speed, plus `env` (NAME=value words).
inline ToolRun run_tool(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  std::vector<std::string> argv{"env", "-u", "NEURON_CC_FLAGS", "-u", "NEURON_COMPILE_CACHE_URL", "-u",
                                "NEURON_PARALLEL_COMPILE_MAX_RETRIES", "NEFFCACHE_FAKE_RATE=0"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.push_back(k_tool);
  argv.insert(argv.end(), args.begin(), args.end());
  return run(argv);
}

// Reads a whole file with open/read; errno on failure.
inline std::pair<int, std::string> read_all(const fs::path& p) {
  int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return {errno, {}};
  std::string out;
  char buf[65536];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return {0, out};
}

// A refusal as the tools make it: exit 1 and one line on stderr, "<program>: error: ...",
// naming `must_contain`.
inline void check_one_line_error(const ToolRun& r, std::string_view must_contain,
                                 std::string_view program = "neffcache") {
  CHECK(r.exit_code == 1);
  CHECK(r.output.rfind(fmt::format("{}: error: ", program), 0) == 0);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 1);
  CHECK(r.output.find(must_contain) != std::string::npos);
}

// An environment of exactly `vars`, for the library's EnvLookup seams.
inline neffcache::EnvLookup env_of(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char* name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// Sets an environment variable for the scope (children started meanwhile see it).
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_) ::setenv(name_, old_->c_str(), 1);
    else ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Lines in a file (0 for a missing file): compiles counted through NEFFCACHE_FAKE_LOG.
// Whether no live process (zombies aside) is in the process group `pgid`.
inline bool no_process_in_group(pid_t pgid) {
  for (const auto& p : fs::directory_iterator("/proc")) {
    auto stat = neffcache::detail::read_file((p.path() / "stat").string());
    if (!stat) continue;
    auto close = stat->rfind(')');  // the name before it may hold anything
    int ppid = 0, pgrp = 0;
    char state = 0;
    if (close == std::string::npos || std::sscanf(stat->c_str() + close + 2, "%c %d %d", &state, &ppid, &pgrp) != 3)
      continue;
    if (pgrp == pgid && state != 'Z') return false;
  }
  return true;
}

// True when a cache folder holds no entries, only our private folder (clean keeps the
// peak memory history there: it describes the compiler, not the entries) and the
// client's cache-wide lock file (<root>/lock, which libneuronxla makes again anyway).
inline bool only_private_left(const fs::path& cache) {
  for (const auto& e : fs::directory_iterator(cache))
    if (e.path().filename() != ".neffcache" && e.path().filename() != "lock") return false;
  return true;
}

inline int count_lines(const fs::path& p) {
  auto r = neffcache::detail::read_file(p.string());
  return r ? static_cast<int>(std::count(r->begin(), r->end(), '\n')) : 0;
}

// The uid of the compiler that wrote line `line` (0-based) of a NEFFCACHE_FAKE_LOG file
// ("pid uid input"); -1 if there is no such line.
inline long logged_uid(const fs::path& log, int line) {
  std::istringstream in(slurp(log));
  std::string text;
  for (int i = 0; i <= line; ++i)
    if (!std::getline(in, text)) return -1;
  std::istringstream words(text);
  long pid = 0, uid = -1;
  words >> pid >> uid;
  return uid;
}

// A clock that moves only when told to.
// Safe to read from any thread while the test moves it.
class FakeClock final : public neffcache::Clock {
 public:
  time_point now() const override { return time_point(duration(ticks_.load())); }
  void set(time_point t) { ticks_ = t.time_since_epoch().count(); }
  void advance(std::chrono::milliseconds d) {
    ticks_ += std::chrono::duration_cast<duration>(d).count();
  }

 private:
  using duration = time_point::duration;
  std::atomic<duration::rep> ticks_{std::chrono::system_clock::now().time_since_epoch().count()};
};

inline std::string hex_decode(const std::string& hex) {
  std::string out;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return out;
}

}  // namespace test
