// What the mount benchmarks share (bench_mount.cpp and the files of its sections): rows
// of the table and how they print, the blobs and entries they build, and the mount they
// run under, the tests' own fixture with the fake compiler.
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include "mount.hpp"
#include "paths.hpp"

namespace mount_bench {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

inline double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Row {
  Row(std::string what_, std::string unit_, std::string goal_ = {}, std::function<bool(double)> met_ = {})
      : what(std::move(what_)), unit(std::move(unit_)), goal(std::move(goal_)), met(std::move(met_)) {}
  // A figure measured once.
  static Row once(std::string what, std::string unit, double value) {
    Row r(std::move(what), std::move(unit));
    r.samples.push_back(value);
    return r;
  }
  std::string what, unit;
  std::string goal;                 // empty: reported only
  std::function<bool(double)> met;  // judged on the median
  std::vector<double> samples;
  std::string failed;  // why there is no figure
};

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline double percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

inline void print_rows(const std::vector<Row>& rows) {
  for (const auto& r : rows) {
    if (!r.failed.empty()) {
      fmt::print("| {} | failed: {} | | | {} | | {} | **no** |\n", r.what, r.failed, r.unit, r.goal);
      continue;
    }
    if (r.samples.empty()) continue;
    auto s = r.samples;
    std::sort(s.begin(), s.end());
    double m = median(s);
    std::string verdict = r.met ? (r.met(m) ? "yes" : "**no**") : "";
    fmt::print("| {} | {:.3g} | {:.3g} | {:.3g} | {} | {} | {} | {} |\n", r.what, m, s.front(), s.back(), r.unit,
               s.size(), r.goal, verdict);
    std::fflush(stdout);
  }
}

inline void note(const std::string& line) { fmt::print(stderr, "bench_mount: {}\n", line); }

// Writes `bytes` of pseudo-random data (incompressible, so no layer can cheat).
inline void write_blob(const fs::path& path, uint64_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  std::mt19937_64 rng(bytes);
  std::vector<uint64_t> chunk(1 << 17);  // 1 MiB
  for (uint64_t left = bytes; left > 0;) {
    for (auto& w : chunk) w = rng();
    auto n = std::min<uint64_t>(left, chunk.size() * sizeof(uint64_t));
    out.write(reinterpret_cast<const char*>(chunk.data()), static_cast<std::streamsize>(n));
    left -= n;
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

inline void touch(const fs::path& path, std::string_view text = {}) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

// Reads a whole file with 1 MiB reads; returns the bytes read.
inline uint64_t read_whole(const fs::path& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(fmt::format("open {}: {}", path.string(), std::strerror(errno)));
  // A thread's buffer is made (and its pages touched) after its first open: a thousand
  // new readers zeroing a MiB each before they open took seconds here, and delayed the
  // opens the waiting benchmark counts.
  static thread_local std::vector<char> buf(1 << 20);
  uint64_t total = 0;
  for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) total += static_cast<uint64_t>(n);
  ::close(fd);
  return total;
}

inline bool drop_caches() {
  ::sync();
  std::ofstream f("/proc/sys/vm/drop_caches");
  f << "3\n";
  f.close();
  return f.good();
}

// A finished entry: model.neff of `neff_bytes` and model.done.
inline fs::path make_done_entry(const fs::path& root, const std::string& name, uint64_t neff_bytes) {
  auto dir = root / "neuronxcc-2.21.0" / ("MODULE_" + name);
  fs::create_directories(dir);
  if (neff_bytes > 4096) write_blob(dir / "model.neff", neff_bytes);
  else touch(dir / "model.neff", std::string(neff_bytes, 'n'));
  touch(dir / "model.done");
  return dir;
}

// A done LNL entry (LNL's hit test: graph.hlo, the NEFF, the marker, the metadata listed)
// whose NEFF has `neff_bytes`, under the key `seed` spells. Returns the NEFF's path.
inline fs::path make_done_lnl_entry(const fs::path& root, uint64_t seed, uint64_t neff_bytes) {
  const std::string key = fmt::format("{:032x}", seed);
  auto dir = root / key;
  fs::create_directories(dir);
  touch(dir / "graph.hlo", "a graph");
  touch(dir / ".artifact_metadata_v0.json", fmt::format(R"({{"cache_key": "{}", "version": 0}})", key));
  const fs::path neff = dir / fmt::format("graph_{}.neff", key);
  if (neff_bytes > 4096) write_blob(neff, neff_bytes);
  else touch(neff, std::string(neff_bytes, 'n'));
  touch(dir / ".compilation_complete", "completed:1\n");
  return neff;
}

// A pending entry whose graph compiles on its own: the flag makes its dedup key unique.
inline fs::path make_pending_entry(const fs::path& root, const std::string& name, const fs::path& hlo) {
  auto dir = root / "neuronxcc-2.21.0" / ("MODULE_" + name);
  fs::create_directories(dir);
  touch(dir / "compile_flags.json", fmt::format(R"(["--internal-bench={}"])", name));
  fs::copy_file(hlo, dir / "model.hlo_module.pb", fs::copy_options::overwrite_existing);
  return dir;
}

// neffcachefs over `backing` at `mnt`, for the scope of a benchmark, compiling with the
// fake compiler; its stderr is not shown.
class Mount : public test::MountedDaemon {
 public:
  // `backing`: a folder, or an s3:// URL (with --local-cache in `daemon_args`).
  Mount(const std::string& backing, const fs::path& mnt, const std::vector<std::string>& env_extra,
        const std::vector<std::string>& daemon_args = {"-j", "2"})
      : test::MountedDaemon(spec(backing, mnt, env_extra, daemon_args)) {}

 private:
  static test::DaemonSpec spec(const std::string& backing, const fs::path& mnt,
                               const std::vector<std::string>& env_extra,
                               const std::vector<std::string>& daemon_args) {
    if (!backing.starts_with("s3://")) fs::create_directories(backing);
    test::DaemonSpec s;
    s.backing = backing;
    s.mnt = mnt;
    s.env = env_extra;
    s.quiet = true;
    s.options = {"--compiler", std::string(test::path::fake_compiler) +
                                   " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}"};
    s.options.insert(s.options.end(), daemon_args.begin(), daemon_args.end());
    return s;
  }
};

}  // namespace mount_bench
