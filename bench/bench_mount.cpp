// neffcachefs against the backing directory read directly, side by side in one run, and
// what the daemon adds around a compile. Every figure that compares is a ratio of the
// two measured in the same repetition (these machines are noisy); the table gives
// median, min and max over the repetitions, the goal, and whether this run met it.
//
//   hit     read a finished NEFF of --hit-mib MiB, of each dialect: warm page cache, and cold
//           (drop_caches); with passthrough and without
//   small   open + read + close of a --small-mib MiB NEFF of each dialect, --small-count times
//   meta    stat of --stat-entries entries' model.neff, and a full walk of a cache of
//           --walk-entries entries; daemon memory and mount time with that cache
//   wakeup  from model.done being renamed into place to the waiting open returning
//   dedup   --dedup-readers readers of one pending entry: compiles, wall / compile time
//   overlap a trial run extracting --overlap-graphs graphs over time, then compiling them:
//           neuron_parallel_compile and the mount against collect-then-compile
//   waiting daemon memory and threads while --waiting-readers opens wait for compiles
//   twins   the content index: the open of a metadata twin of a done --twin-neff-mib MiB
//           NEFF against an open of the done entry; compiles for --twins-per-graph twins
//           of each of --twin-graphs done graphs; the index's lookup with
//           --index-records records against an empty index (bench_twins.cpp)
//   s3fetch with an s3:// cache: the first open of a done --s3-neff-mib MiB NEFF (fetched
//           into the local tier) against a plain GET of the object into a file; later
//           opens against reads of the local tier's file
//   s3pair  the 34-graph workload read through two daemons on one bucket against one
//           daemon: makespan, and compiles (each graph once)
//   s3twin  the first open, through a fresh mount, of an entry whose graph another entry
//           of the bucket holds done (--s3-twin-mib MiB NEFF, served from the bucket's
//           content index: records checked, the NEFF copied on the server, then fetched)
//           against the first open of that done entry itself
//   s3warm  a fresh host on a bucket --s3-delay-ms away (every request delayed by
//           tests/s3/faulty_proxy.py): every NEFF of a model opened in order through a
//           mount, lazily against `neffcache warm` of its manifest first, the warm step
//           included; a model of --warm-small-count 1 MiB NEFFs and one of
//           --warm-large-count NEFFs of --warm-large-mib MiB
//   s3farm  a compile farm (neffcache compile --watch): the 34-graph workload written into a
//           bucket while two farm processes watch it, against one; makespan, and compiles
//           (each graph once)
//   s3hosts torch-xla ranks that take their own locks (the conformance suite's client), 4 on
//           one mount of a bucket against 2 on each of two mounts of it, --hosts-graphs new
//           graphs at once: the time until every rank is done, and compiles (each graph once)
//
// `--only NAME` runs one of them. Needs root for cold-cache figures (drop_caches). The S3
// benchmarks need `--s3-env FILE`, the s3.env of a server (tests/s3/radosgw.sh start DIR).
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/detail/proc.hpp>
#include <neffcache/core/detail/process.hpp>
#include <neffcache/s3/client.hpp>

#include "bench_twins.hpp"
#include "mount_bench.hpp"
#include "process.hpp"
#include "paths.hpp"
#include "synth.hpp"

extern char** environ;

namespace {

using namespace mount_bench;

struct Options {
  int reps = 5;
  uint64_t hit_mib = 1024, small_mib = 10;
  int small_count = 1000, stat_entries = 10000, walk_entries = 100000, wake_entries = 100, dedup_readers = 64;
  double dedup_compile_seconds = 1.0;
  int overlap_graphs = 16, waiting_readers = 1000;
  double overlap_compile_seconds = 0.5;
  std::string only, dir;
  std::string s3_env;  // the server's s3.env (S3_ENDPOINT, S3_ACCESS_KEY, S3_SECRET_KEY)
  uint64_t s3_neff_mib = 1024;
  int s3_delay_ms = 20;
  uint64_t s3_twin_mib = 256;
  int warm_small_count = 200, warm_large_count = 20;
  uint64_t warm_large_mib = 64;
  int pair_jobs = 4;
  double pair_scale = 0.05, pair_rate = 1000;
  int hosts_graphs = 10;
  double hosts_compile_seconds = 1.0;
  TwinOptions twins;
  std::string passthrough_hp;  // libfuse's example program, for the small-hit comparison
};

// CPU seconds (user + system) a process has used: /proc/PID/stat's utime and stime
// (fields 14 and 15; proc_stat_fields starts at field 3).
double cpu_seconds(pid_t pid) {
  auto fields = neffcache::detail::proc_stat_fields(pid);
  if (!fields || fields->size() < 13) return 0;
  const double ticks = std::stod((*fields)[11]) + std::stod((*fields)[12]);
  return ticks / static_cast<double>(::sysconf(_SC_CLK_TCK));
}

// libfuse's passthrough_hp example over `backing` at `mnt`, for as long as it lives: what
// a FUSE file system that passes reads through does at best.
std::unique_ptr<test::MountedDaemon> libfuse_example(const std::string& program, const fs::path& backing,
                                                     const fs::path& mnt, const std::vector<std::string>& options = {}) {
  test::DaemonSpec spec;
  spec.backing = backing.string();
  spec.mnt = mnt;
  spec.options = options;
  spec.quiet = true;
  spec.program = program;
  return std::make_unique<test::MountedDaemon>(spec);
}

// 1. A finished NEFF read whole, warm and cold, in each dialect (a done Neuron entry's
// model.neff, a done LNL entry's graph_<key>.neff): natively, and through two mounts of one
// backing folder, with FUSE passthrough (where it is on) and without, side by side; with
// --passthrough-hp, through libfuse's passthrough_hp --nopassthrough too, what a FUSE file
// system that reads through the page cache does at best here.
std::vector<Row> bench_hit(const Options& o, const fs::path& work) {
  auto backing = work / "hit-backing";
  note(fmt::format("hit: writing two {} MiB NEFFs", o.hit_mib));
  const fs::path neffs[2] = {make_done_entry(backing, "hit+0", o.hit_mib << 20) / "model.neff",
                             make_done_lnl_entry(backing, 0x4817, o.hit_mib << 20)};
  const char* dialects[2] = {"Neuron", "LNL"};
  Mount on(backing, work / "hit-mnt", {});
  Mount off(backing, work / "hit-mnt-off", {}, {"-j", "2", "--no-passthrough"});
  std::unique_ptr<test::MountedDaemon> hp;
  if (!o.passthrough_hp.empty()) hp = libfuse_example(o.passthrough_hp, backing, work / "hit-hp", {"--nopassthrough"});
  const bool passthrough = on.stats()["passthrough"]["on"] == true;
  if (!passthrough)
    note("hit: passthrough is off here (" + on.stats()["passthrough"]["why_off"].get<std::string>() +
         "): both mounts read through the daemon");
  // Without passthrough here, the first mount's rows say so (and have no goal).
  const std::string on_name = passthrough ? "passthrough on" : "passthrough on (off here)";
  struct Way {
    std::string name;
    fs::path root;
    Mount* mount;
  };
  std::vector<Way> ways{{"native", backing, nullptr},
                        {"mount, " + on_name, work / "hit-mnt", &on},
                        {"mount, passthrough off", work / "hit-mnt-off", &off}};
  if (hp) ways.push_back({"passthrough_hp --nopassthrough", work / "hit-hp", nullptr});
  const double gib = static_cast<double>(o.hit_mib) / 1024.0;
  // (stats.json's own reads are not counted.)
  auto reads_of = [](Mount& m) { return m.stats()["reads"].get<uint64_t>(); };
  std::vector<Row> rows;
  for (int d = 0; d < 2; ++d) {
    const fs::path rel = fs::relative(neffs[d], backing);
    for (bool cold : {false, true}) {
      if (cold && !drop_caches()) {
        note("hit: cannot drop caches (not root?): no cold figures");
        break;
      }
      const std::string label =
          fmt::format("hit, {}: read a {} MiB NEFF, {} page cache", dialects[d], o.hit_mib, cold ? "cold" : "warm");
      auto goal = [&](double at_least) {
        return std::function<bool(double)>([at_least](double v) { return v >= at_least; });
      };
      std::vector<Row> ratio, speed, reads, cpu;
      for (std::size_t w = 0; w < ways.size(); ++w) {
        speed.push_back(Row{fmt::format("{}, {}", label, ways[w].name), "GiB/s"});
        if (w == 0) continue;
        const bool on_goal = ways[w].mount == &on && passthrough;
        ratio.push_back(on_goal ? Row{label + ": " + ways[w].name + " / native throughput", "ratio",
                                      cold ? ">= 0.95" : ">= 0.98", goal(cold ? 0.95 : 0.98)}
                                : Row{label + ": " + ways[w].name + " / native throughput", "ratio"});
        if (!ways[w].mount) continue;
        reads.push_back(Row{label + ": READ requests per GiB, " + ways[w].name, "count"});
        cpu.push_back(Row{label + ": daemon CPU seconds per GiB, " + ways[w].name, "s"});
      }
      Row off_hp{label + ": mount, passthrough off / passthrough_hp --nopassthrough throughput", "ratio"};
      if (!cold)
        for (const auto& w : ways) read_whole(w.root / rel);
      for (int r = 0; r < o.reps; ++r) {
        std::vector<double> t(ways.size());
        for (std::size_t k = 0; k < ways.size(); ++k) {
          const std::size_t which = (k + static_cast<std::size_t>(r)) % ways.size();  // each goes first in turn
          Mount* m = ways[which].mount;
          if (cold) drop_caches();
          const double cpu_before = m ? cpu_seconds(m->pid()) : 0;
          const uint64_t reads_before = m ? reads_of(*m) : 0;
          auto t0 = Clock::now();
          read_whole(ways[which].root / rel);
          t[which] = since(t0);
          if (!m) continue;
          const std::size_t at = m == &on ? 0 : 1;  // the mounts are ways 1 and 2
          reads[at].samples.push_back(static_cast<double>(reads_of(*m) - reads_before) / gib);
          cpu[at].samples.push_back((cpu_seconds(m->pid()) - cpu_before) / gib);
        }
        for (std::size_t k = 0; k < ways.size(); ++k) speed[k].samples.push_back(gib / t[k]);
        for (std::size_t k = 1; k < ways.size(); ++k) ratio[k - 1].samples.push_back(t[0] / t[k]);
        if (hp) off_hp.samples.push_back(t[3] / t[2]);
      }
      for (auto* group : {&ratio, &speed, &reads, &cpu})
        for (auto& row : *group) rows.push_back(std::move(row));
      if (hp) rows.push_back(std::move(off_hp));
    }
  }
  return rows;
}

// 2. Many small hits in each dialect: open + read + close, natively, through the mount
// with passthrough (where it is on) and without, and (with --passthrough-hp) through
// libfuse's passthrough_hp, the limit for a FUSE open.
std::vector<Row> bench_small(const Options& o, const fs::path& work) {
  auto backing = work / "small-backing";
  const fs::path neffs[2] = {make_done_entry(backing, "small+0", o.small_mib << 20) / "model.neff",
                             make_done_lnl_entry(backing, 0x5a11, o.small_mib << 20)};
  const char* dialects[2] = {"Neuron", "LNL"};
  Mount on(backing, work / "small-mnt", {});
  Mount off(backing, work / "small-mnt-off", {}, {"-j", "2", "--no-passthrough"});
  std::unique_ptr<test::MountedDaemon> hp;
  if (!o.passthrough_hp.empty()) hp = libfuse_example(o.passthrough_hp, backing, work / "small-hp");
  std::vector<fs::path> roots{backing, work / "small-mnt", work / "small-mnt-off"};
  if (hp) roots.push_back(work / "small-hp");
  std::vector<Row> rows;
  for (int d = 0; d < 2; ++d) {
    const fs::path rel = fs::relative(neffs[d], backing);
    std::string label = fmt::format("small hits, {}: open + read + close of a {} MiB NEFF, {} times", dialects[d],
                                    o.small_mib, o.small_count);
    Row ratio{label + ": mount / native time", "ratio", "<= 1.25", [](double v) { return v <= 1.25; }};
    Row ratio_off{label + ": mount, passthrough off / native time", "ratio"};
    Row per{label + ", mount, per hit", "ms"};
    Row hp_native{label + ": passthrough_hp / native time", "ratio"};
    Row ours_hp{label + ": mount / passthrough_hp time", "ratio", "<= 1.10", [](double v) { return v <= 1.10; }};
    for (const auto& root : roots) read_whole(root / rel);
    for (int r = 0; r < o.reps; ++r) {
      std::vector<double> t(roots.size());
      for (std::size_t k = 0; k < roots.size(); ++k) {
        const std::size_t which = (k + static_cast<std::size_t>(r)) % roots.size();  // each goes first in turn
        const fs::path path = roots[which] / rel;
        auto t0 = Clock::now();
        for (int i = 0; i < o.small_count; ++i) read_whole(path);
        t[which] = since(t0);
      }
      ratio.samples.push_back(t[1] / t[0]);
      ratio_off.samples.push_back(t[2] / t[0]);
      per.samples.push_back(t[1] * 1000.0 / o.small_count);
      if (hp) {
        hp_native.samples.push_back(t[3] / t[0]);
        ours_hp.samples.push_back(t[1] / t[3]);
      }
    }
    rows.push_back(std::move(ratio));
    rows.push_back(std::move(ratio_off));
    rows.push_back(std::move(per));
    if (hp) {
      rows.push_back(std::move(hp_native));
      rows.push_back(std::move(ours_hp));
    }
  }
  return rows;
}

// Visits every file below `dir`: readdir, then fstatat of each name, as `find -ls` or
// `du` would. Returns the files seen.
uint64_t walk(int dir_fd) {
  int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return 0;
  DIR* d = ::fdopendir(fd);
  if (!d) return 0;
  uint64_t n = 0;
  while (dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    ++n;
    if (S_ISDIR(st.st_mode)) {
      int sub = ::openat(::dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
      if (sub >= 0) n += walk(sub), ::close(sub);
    }
  }
  ::closedir(d);
  return n;
}

uint64_t walk(const fs::path& root) {
  int fd = ::open(root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  uint64_t n = walk(fd);
  ::close(fd);
  return n;
}

// 3. Metadata: stat of many entries, a walk of a large cache; the daemon's footprint.
std::vector<Row> bench_meta(const Options& o, const fs::path& work) {
  auto backing = work / "meta-backing";
  note(fmt::format("meta: creating a cache of {} entries", o.walk_entries));
  std::vector<fs::path> neffs;
  for (int i = 0; i < o.walk_entries; ++i) {
    auto e = make_done_entry(backing, fmt::format("{:020x}+d7517139", i), 64);
    if (i < o.stat_entries) neffs.push_back(fs::relative(e / "model.neff", backing));
  }
  const bool can_drop = drop_caches();
  const uint64_t files = walk(backing);
  Mount m(backing, work / "meta-mnt", {});
  const fs::path mnt = work / "meta-mnt";
  std::vector<Row> rows;
  rows.push_back(Row::once(fmt::format("mount time, {} entries", o.walk_entries), "ms", m.mount_seconds() * 1000));
  const double rss_idle = m.rss_mib();
  auto stat_all = [&](const fs::path& root) {
    struct stat st {};
    for (const auto& p : neffs)
      if (::stat((root / p).c_str(), &st) != 0)
        throw std::runtime_error(fmt::format("stat of {}: {}", p.string(), std::strerror(errno)));
  };
  // Times `op` on the backing directory and on the mount, alternating which goes first,
  // after dropping the caches when `cold`; gives the ratios and the mount's times.
  auto compare = [&](Row& ratio, Row* mount_seconds, bool cold, const std::function<void(const fs::path&)>& op) {
    if (!cold) op(backing), op(mnt);
    for (int r = 0; r < o.reps; ++r) {
      double t[2];
      for (int k = 0; k < 2; ++k) {
        bool through_mount = (k == 1) != (r % 2 == 1);
        if (cold) drop_caches();
        auto t0 = Clock::now();
        op(through_mount ? mnt : backing);
        t[through_mount] = since(t0);
      }
      ratio.samples.push_back(t[1] / t[0]);
      if (mount_seconds) mount_seconds->samples.push_back(t[1]);
    }
  };
  for (bool cold : {true, false}) {
    if (cold && !can_drop) continue;
    const std::string c = cold ? "cold" : "warm";
    Row st{fmt::format("stat of {} entries, {}: mount / native time", o.stat_entries, c), "ratio", "<= 2",
           [](double v) { return v <= 2; }};
    try {
      compare(st, nullptr, cold, stat_all);
    } catch (const std::exception& e) {
      st.failed = e.what();
    }
    rows.push_back(std::move(st));
  }
  for (bool cold : {true, false}) {
    if (cold && !can_drop) continue;
    const std::string c = cold ? "cold" : "warm";
    Row wk{fmt::format("walk of {} entries, {}: mount / native time", o.walk_entries, c), "ratio", "<= 2",
           [](double v) { return v <= 2; }};
    Row wk_mnt{fmt::format("walk of {} entries, {}, mount", o.walk_entries, c), "s"};
    try {
      compare(wk, &wk_mnt, cold, [&](const fs::path& root) {
        if (uint64_t seen = walk(root); seen != files)
          throw std::runtime_error(fmt::format("saw {} of {} names", seen, files));
      });
    } catch (const std::exception& e) {
      wk.failed = e.what();
    }
    rows.push_back(std::move(wk));
    rows.push_back(std::move(wk_mnt));
  }
  (void)walk(mnt);  // every name known to the kernel and the daemon at once
  rows.push_back(Row::once(fmt::format("daemon memory, idle, {}-entry cache", o.walk_entries), "MiB", rss_idle));
  rows.push_back(Row::once(fmt::format("daemon memory after a walk of {} entries", o.walk_entries), "MiB", m.rss_mib()));
  return rows;
}

// 4. Wake-up: model.done renamed into place -> the waiting open returns.
std::vector<Row> bench_wakeup(const Options& o, const fs::path& work) {
  auto backing = work / "wake-backing";
  const fs::path hlo = fs::path(test::path::corpus) / "gopjrt_tuple.hlo.pb";
  std::vector<fs::path> entries;
  for (int i = 0; i < o.wake_entries; ++i) entries.push_back(make_pending_entry(backing, fmt::format("w{}+0", i), hlo));
  Mount m(backing, work / "wake-mnt", {"NEFFCACHE_FAKE_RATE=0"});
  int in = ::inotify_init1(IN_CLOEXEC);
  std::map<int, std::size_t> by_watch;
  for (std::size_t i = 0; i < entries.size(); ++i)
    by_watch[::inotify_add_watch(in, entries[i].c_str(), IN_MOVED_TO | IN_CREATE)] = i;
  std::vector<std::atomic<int64_t>> done_at(entries.size());
  std::atomic<bool> stop{false};
  std::thread watcher([&] {
    alignas(inotify_event) char buf[64 * 1024];
    while (!stop) {
      pollfd p{in, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ssize_t n = ::read(in, buf, sizeof buf);
      if (n <= 0) return;
      const auto now = Clock::now().time_since_epoch().count();
      for (char* p = buf; p < buf + n;) {
        auto* ev = reinterpret_cast<inotify_event*>(p);
        if (ev->len > 0 && std::string_view(ev->name) == "model.done") {
          done_at[by_watch[ev->wd]] = now;
        }
        p += sizeof(inotify_event) + ev->len;
      }
    }
  });
  // Also when a measurement throws: a joinable thread would end the process at unwinding.
  struct Stop {
    std::atomic<bool>& stop;
    std::thread& watcher;
    int in;
    ~Stop() {
      stop = true;
      watcher.join();
      ::close(in);
    }
  } stop_watching{stop, watcher, in};
  Row wake{"wake-up: model.done in place -> waiting open returns, median", "ms", "<= 1", [](double v) { return v <= 1; }};
  Row p99{"wake-up: the same, p99", "ms"};
  std::vector<double> waits;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    auto path = work / "wake-mnt" / fs::relative(entries[i], backing) / "model.neff";
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // waits for the compile
    const auto returned = Clock::now().time_since_epoch().count();
    if (fd < 0) throw std::runtime_error("open " + path.string() + ": " + std::strerror(errno));
    ::close(fd);
    for (int spin = 0; spin < 1000 && done_at[i] == 0; ++spin) std::this_thread::sleep_for(std::chrono::microseconds(100));
    if (done_at[i] == 0)
      throw std::runtime_error(fmt::format("wake-up: no model.done was written in {} (was it compiled before?)",
                                           entries[i].string()));
    waits.push_back(static_cast<double>(returned - done_at[i]) / 1e6);
  }
  // One figure per run: the median and p99 over the entries.
  wake.samples.push_back(median(waits));
  p99.samples.push_back(percentile(waits, 0.99));
  return {std::move(wake), std::move(p99)};
}

// 5. Many readers of one pending entry.
std::vector<Row> bench_dedup(const Options& o, const fs::path& work) {
  auto backing = work / "dedup-backing";
  const fs::path hlo = fs::path(test::path::corpus) / "gopjrt_tuple.hlo.pb";
  Mount m(backing, work / "dedup-mnt", {fmt::format("NEFFCACHE_FAKE_SECONDS={}", o.dedup_compile_seconds)});
  Row compiles{fmt::format("dedup: {} readers of one pending entry, compiles", o.dedup_readers), "count", "= 1",
               [](double v) { return v == 1; }};
  Row ratio{"dedup: the same, wall time / compile time", "ratio", "<= 1.05", [](double v) { return v <= 1.05; }};
  for (int r = 0; r < o.reps; ++r) {
    auto entry = make_pending_entry(backing, fmt::format("d{}+0", r), hlo);
    auto path = work / "dedup-mnt" / fs::relative(entry, backing) / "model.neff";
    auto before = m.stats()["compiles"];
    std::atomic<int> failures{0};
    auto t0 = Clock::now();
    std::vector<std::thread> readers;
    for (int i = 0; i < o.dedup_readers; ++i)
      readers.emplace_back([&] {
        try {
          read_whole(path);
        } catch (const std::exception&) {
          ++failures;
        }
      });
    for (auto& t : readers) t.join();
    const double wall = since(t0);
    if (failures) throw std::runtime_error(fmt::format("dedup: {} readers failed", failures.load()));
    auto after = m.stats()["compiles"];
    compiles.samples.push_back(after["started"].get<double>() - before["started"].get<double>());
    ratio.samples.push_back(wall / (after["seconds"].get<double>() - before["seconds"].get<double>()));
  }
  return {std::move(compiles), std::move(ratio)};
}

// Runs a shell command line; throws if it fails.
void shell(const std::string& line) {
  if (int rc = std::system(line.c_str()); rc != 0)
    throw std::runtime_error(fmt::format("failed ({}): {}", rc, line));
}

std::string fake_template() {
  return std::string(test::path::fake_compiler) + " compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags}";
}

// Entries with model.done below a cache root.
int done_entries(const fs::path& root) {
  int n = 0;
  std::error_code ec;
  for (const auto& c : fs::directory_iterator(root, ec))
    for (const auto& e : fs::directory_iterator(c.path(), ec)) n += fs::exists(e.path() / "model.done");
  return n;
}

// 6. Overlap: a trial run that extracts graphs over time, then their compiles. The
// original flow collects everything, then compiles; ours compiles while the trial run
// goes on (neuron_parallel_compile) or as each graph is written (the mount, eager).
// The compiler sleeps (NEFFCACHE_FAKE_IDLE), as one on other cores would, and extraction
// takes as long as compiling everything on two workers.
std::vector<Row> bench_overlap(const Options& o, const fs::path& work) {
  const int n = o.overlap_graphs, jobs = 2;
  const double compile = o.overlap_compile_seconds, interval = compile / jobs;
  const fs::path graphs = work / "overlap-graphs";
  fs::create_directories(graphs);
  for (int k = 0; k < n; ++k)  // distinct graphs (their sizes differ)
    touch(graphs / fmt::format("g{:02}.hlo.pb", k), neffcache::bench::synthesize_module(4096 * (k + 1), 512));
  const std::string fake_env = fmt::format("NEFFCACHE_FAKE_IDLE=1 NEFFCACHE_FAKE_SECONDS={}", compile);
  const std::string tmpl = fake_template();
  auto env = [&](const fs::path& cache) {
    return fmt::format("env -C '{}' -u NEURON_CC_FLAGS -u NEURON_EXTRACT_GRAPHS_ONLY NEURON_COMPILE_CACHE_URL='{}' {}",
                       work.string(), cache.string(), fake_env);
  };
  const std::string trial = fmt::format("{} --poll 0.02 --extract-interval {} --compiler '{}' '{}'", test::path::client_sim,
                                        interval, tmpl, graphs.string());
  const std::string npc = fmt::format("{} --num_parallel {} --compiler '{}'", test::path::npc, jobs, tmpl);
  const std::string quiet = " >/dev/null 2>&1";
  auto finished = [&](const fs::path& cache, const char* flow) {
    if (int done = done_entries(cache); done != n)
      throw std::runtime_error(fmt::format("overlap: {}: {} of {} entries done", flow, done, n));
  };
  Row two_phase{fmt::format("overlap: {} graphs, extraction = compile time ({} s each, {} workers): collect, then compile",
                            n, compile, jobs), "s"};
  Row npc_row{"overlap: the same, neuron_parallel_compile (compiles during the trial run)", "s"};
  Row mount_row{"overlap: the same, trial run through the mount (eager compiles)", "s"};
  Row npc_ratio{"overlap: neuron_parallel_compile / collect-then-compile", "ratio", "<= 0.7", [](double v) { return v <= 0.7; }};
  Row mount_ratio{"overlap: mount / collect-then-compile", "ratio", "<= 0.7", [](double v) { return v <= 0.7; }};
  for (int r = 0; r < o.reps; ++r) {
    const fs::path a = work / fmt::format("overlap-a{}", r), b = work / fmt::format("overlap-b{}", r),
                   c = work / fmt::format("overlap-c{}", r);
    auto t0 = Clock::now();
    shell(env(a) + " " + npc + " --command collect " + trial + quiet);
    shell(env(a) + " " + npc + " --command compile" + quiet);
    const double t_two = since(t0);
    finished(a, "collect, then compile");
    t0 = Clock::now();
    shell(env(b) + " " + npc + " " + trial + quiet);
    const double t_npc = since(t0);
    finished(b, "neuron_parallel_compile");
    {
      Mount m(c, work / "overlap-mnt", {"NEFFCACHE_FAKE_IDLE=1", fmt::format("NEFFCACHE_FAKE_SECONDS={}", compile)});
      t0 = Clock::now();
      shell(env(work / "overlap-mnt") + " NEURON_EXTRACT_GRAPHS_ONLY=1 " + trial + quiet);
      while (done_entries(c) < n && since(t0) < 600) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const double t_mount = since(t0);
    finished(c, "mount");
    two_phase.samples.push_back(t_two);
    npc_row.samples.push_back(t_npc);
    mount_row.samples.push_back(t_mount);
    npc_ratio.samples.push_back(t_npc / t_two);
    mount_ratio.samples.push_back(t_mount / t_two);
  }
  return {std::move(npc_ratio), std::move(mount_ratio), std::move(two_phase), std::move(npc_row), std::move(mount_row)};
}

// 7. Footprint while many readers wait: --waiting-readers threads open model.neff of 10
// pending entries whose compiles take long enough for all of them to be waiting.
std::vector<Row> bench_waiting(const Options& o, const fs::path& work) {
  const int entries = 10;
  auto backing = work / "waiting-backing";
  const fs::path hlo = fs::path(test::path::corpus) / "gopjrt_tuple.hlo.pb";
  std::vector<fs::path> paths;
  for (int k = 0; k < entries; ++k)
    paths.push_back(work / "waiting-mnt" /
                    fs::relative(make_pending_entry(backing, fmt::format("w{}+0", k), hlo), backing) / "model.neff");
  Mount m(backing, work / "waiting-mnt", {"NEFFCACHE_FAKE_IDLE=1", "NEFFCACHE_FAKE_SECONDS=3"});
  const double idle = m.rss_mib();
  std::atomic<int> failures{0};
  std::vector<std::thread> readers;
  for (int i = 0; i < o.waiting_readers; ++i)
    readers.emplace_back([&, i] {
      try {
        read_whole(paths[static_cast<std::size_t>(i % entries)]);
      } catch (const std::exception&) {
        ++failures;
      }
    });
  int waiting = 0, threads = 0, fds = 0;
  double rss = 0;
  std::string error;
  try {
    for (auto t0 = Clock::now(); waiting < o.waiting_readers && since(t0) < 30;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      waiting = std::max(waiting, m.stats()["waiters"].get<int>());
    }
    rss = m.rss_mib(), threads = m.threads(), fds = m.fds();
  } catch (const std::exception& e) {
    error = e.what();
  }
  for (auto& t : readers) t.join();
  if (!error.empty()) throw std::runtime_error("waiting: " + error);
  if (failures) throw std::runtime_error(fmt::format("waiting: {} readers failed", failures.load()));
  if (waiting < o.waiting_readers)
    throw std::runtime_error(fmt::format("waiting: at most {} of {} readers were waiting at once", waiting, o.waiting_readers));
  return {Row::once(fmt::format("daemon memory, idle, {} pending entries", entries), "MiB", idle),
          Row::once(fmt::format("daemon memory with {} readers waiting on them", waiting), "MiB", rss),
          Row::once(fmt::format("daemon threads with {} readers waiting", waiting), "count", threads),
          Row::once(fmt::format("daemon descriptors with {} readers waiting", waiting), "count", fds)};
}

// The S3 server of --s3-env, as the environment a daemon or client needs.
std::vector<std::string> s3_environment(const Options& o) {
  if (o.s3_env.empty()) throw std::runtime_error("needs --s3-env FILE (tests/s3/radosgw.sh start DIR writes DIR/s3.env)");
  std::map<std::string, std::string> vars;
  std::ifstream in(o.s3_env);
  for (std::string line; std::getline(in, line);)
    if (auto eq = line.find('='); eq != std::string::npos) vars[line.substr(0, eq)] = line.substr(eq + 1);
  if (!vars.contains("S3_ENDPOINT")) throw std::runtime_error(fmt::format("{}: no S3_ENDPOINT", o.s3_env));
  return {"AWS_ENDPOINT_URL=" + vars["S3_ENDPOINT"], "AWS_ACCESS_KEY_ID=" + vars["S3_ACCESS_KEY"],
          "AWS_SECRET_ACCESS_KEY=" + vars["S3_SECRET_KEY"], "AWS_REGION=us-east-1", "AWS_EC2_METADATA_DISABLED=true"};
}

// A new bucket on that server and a client for it.
std::unique_ptr<neffcache::S3Client> s3_bucket(const std::vector<std::string>& env, const std::string& name) {
  std::map<std::string, std::string> vars;
  for (const auto& e : env) vars[e.substr(0, e.find('='))] = e.substr(e.find('=') + 1);
  auto lookup = [vars](const char* k) -> std::optional<std::string> {
    auto it = vars.find(k);
    return it == vars.end() ? std::nullopt : std::optional<std::string>(it->second);
  };
  auto client = neffcache::S3Client::open(neffcache::parse_cache_url("s3://" + name).value(), lookup);
  if (!client) throw std::runtime_error(client.error().message);
  if (auto made = (*client)->create_bucket(); !made) throw std::runtime_error(made.error().message);
  return std::move(*client);
}

template <class T>
T need(neffcache::Result<T> r) {
  if (!r) throw std::runtime_error(r.error().message);
  return std::move(*r);
}

// Graphs compiled more than once, from fake-neuronx-cc's log (NEFFCACHE_FAKE_LOG: one line
// per compile, naming its input); `what` fails if not every one of `graphs` compiled.
int compiled_more_than_once(const fs::path& log, std::size_t graphs, const std::string& what) {
  std::map<std::string, int> compiles;
  std::ifstream in(log);
  for (std::string pid, uid, input; in >> pid >> uid >> input;) {
    auto at = input.find("MODULE_");
    if (at == std::string::npos) throw std::runtime_error(fmt::format("{}: a compile of {}", what, input));
    ++compiles[input.substr(at, input.find_first_of("/.", at) - at)];
  }
  if (compiles.size() != graphs) throw std::runtime_error(fmt::format("{}: {} graphs compiled", what, compiles.size()));
  int twice = 0;
  for (const auto& [g, n] : compiles) twice += n - 1;
  return twice;
}

// One process (daemon, farm) against two, --reps times, alternating which goes first:
// `makespan(n)` gives the seconds and the graphs compiled more than once; `ratio` gets two /
// one, `one` the seconds of one, `extra` the repeats of two.
void one_against_two(const Options& o, const std::function<std::pair<double, int>(int)>& makespan, Row& ratio,
                     Row& one, Row& extra) {
  for (int r = 0; r < o.reps; ++r) {
    double single = 0, pair = 0;
    int twice = 0;
    for (int n : r % 2 == 0 ? std::vector{1, 2} : std::vector{2, 1}) {
      auto [seconds, repeats] = makespan(n);
      (n == 1 ? single : pair) = seconds;
      if (n == 2) twice = repeats;
    }
    ratio.samples.push_back(pair / single);
    one.samples.push_back(single);
    extra.samples.push_back(twice);
  }
}

// 8. A done NEFF on S3: first open through a mount (fetched into its local tier) against
// a plain GET of the object into a file; then opens served from the tier against reads
// of the tier's file itself, warm.
std::vector<Row> bench_s3fetch(const Options& o, const fs::path& work) {
  auto env = s3_environment(o);
  auto s3 = s3_bucket(env, fmt::format("bench-fetch-{}", ::getpid()));
  const std::string rel = "neuronxcc-2.21.0/MODULE_fetch+0";
  note(fmt::format("s3fetch: uploading a {} MiB NEFF", o.s3_neff_mib));
  write_blob(work / "blob", o.s3_neff_mib << 20);
  need(s3->upload(rel + "/model.neff", (work / "blob").string()));
  fs::remove(work / "blob");
  need(s3->put(rel + "/model.hlo_module.pb", neffcache::bench::synthesize_module(1 << 10, 512)));
  need(s3->put(rel + "/model.done", ""));
  const double gib = static_cast<double>(o.s3_neff_mib) / 1024.0;
  Row first(fmt::format("s3: first open of a done {} MiB NEFF through the mount / plain GET into a file, time",
                        o.s3_neff_mib), "ratio", "<= 1.5", [](double m) { return m <= 1.5; });
  Row get_rate(fmt::format("s3: plain GET of the {} MiB NEFF into a file", o.s3_neff_mib), "GiB/s");
  Row opened("s3: first open of it through the mount, until open returns (the fetch)", "s");
  Row later(fmt::format("s3: later opens of it, warm: mount / native read of the local tier, throughput"), "ratio",
            ">= 0.95", [](double m) { return m >= 0.95; });
  for (int r = 0; r < o.reps; ++r) {
    double get_s = 0, mount_s = 0;
    auto plain = [&] {
      auto t0 = Clock::now();
      need(s3->download(rel + "/model.neff", (work / "got").string()));
      get_s = since(t0);
      fs::remove(work / "got");
    };
    const fs::path tier = work / fmt::format("tier{}", r);
    {
      Mount m(fmt::format("s3://{}", s3->bucket()), work / "s3mnt", env,
              {"-j", "2", "--local-cache", tier.string()});
      if (r % 2 == 0) plain();
      auto t0 = Clock::now();
      const fs::path neff = work / "s3mnt" / rel / "model.neff";
      int fd = ::open(neff.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw std::runtime_error(fmt::format("open {}: {}", neff.string(), std::strerror(errno)));
      opened.samples.push_back(since(t0));
      std::vector<char> buf(1 << 20);
      uint64_t total = 0;
      for (ssize_t n; (n = ::read(fd, buf.data(), buf.size())) > 0;) total += static_cast<uint64_t>(n);
      ::close(fd);
      mount_s = since(t0);
      if (total != o.s3_neff_mib << 20) throw std::runtime_error("short read");
      if (r % 2 == 1) plain();
      // Both warm, as after earlier reads: the mount's pages of the file and the tier's
      // (the first read after the fetch fills the mount's; it takes a second to settle).
      for (int warm = 0; warm < 2; ++warm) read_whole(neff), read_whole(tier / rel / "model.neff");
      double native = 0, mounted = 0;
      for (bool through_mount : {r % 2 == 0, r % 2 == 1}) {
        auto t1 = Clock::now();
        read_whole(through_mount ? work / "s3mnt" / rel / "model.neff" : tier / rel / "model.neff");
        (through_mount ? mounted : native) = since(t1);
      }
      later.samples.push_back(native / mounted);
    }
    fs::remove_all(tier);
    first.samples.push_back(mount_s / get_s);
    get_rate.samples.push_back(gib / get_s);
  }
  return {first, get_rate, opened, later};
}

// 9. The 34-graph workload through one daemon, then through two on one bucket, every
// daemon asked for every graph (as every host of a training job is): makespans side by
// side, and compiles counted (each graph once across the daemons).
std::vector<Row> bench_s3pair(const Options& o, const fs::path& work) {
  auto env = s3_environment(o);
  note(fmt::format("s3pair: synthesizing {} graphs", neffcache::bench::k_workload_graphs));
  auto graphs = neffcache::bench::llama_workload(o.pair_scale, o.pair_rate);
  env.insert(env.end(), {fmt::format("NEFFCACHE_FAKE_RATE={}", o.pair_rate), "NEFFCACHE_FAKE_IDLE=1"});
  Row ratio(fmt::format("s3: makespan of 34 graphs read through 2 daemons on one bucket / 1 daemon, {} compiles each",
                        o.pair_jobs), "ratio", "<= 0.6", [](double m) { return m <= 0.6; });
  Row one("s3: makespan of 34 graphs through 1 daemon", "s");
  Row extra("s3: graphs compiled more than once, 2 daemons", "count", "0", [](double m) { return m == 0; });
  int run = 0;
  auto makespan = [&](int daemons) {
    auto s3 = s3_bucket(env, fmt::format("bench-pair-{}-{}", ::getpid(), run));
    std::vector<std::string> rels;
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      rels.push_back(fmt::format("neuronxcc-2.21.0/MODULE_{}+pair", i));
      need(s3->put(rels.back() + "/model.hlo_module.pb", graphs[i]));
    }
    const fs::path log = work / fmt::format("pair{}.log", run);
    auto daemon_env = env;
    daemon_env.push_back("NEFFCACHE_FAKE_LOG=" + log.string());
    std::vector<std::unique_ptr<Mount>> mounts;
    for (int d = 0; d < daemons; ++d)
      mounts.push_back(std::make_unique<Mount>(
          fmt::format("s3://{}", s3->bucket()), work / fmt::format("pair{}-mnt{}", run, d), daemon_env,
          std::vector<std::string>{"-j", std::to_string(o.pair_jobs), "--local-cache",
                                   (work / fmt::format("pair{}-tier{}", run, d)).string()}));
    std::atomic<int> failures{0};
    auto t0 = Clock::now();
    std::vector<std::thread> readers;
    for (int d = 0; d < daemons; ++d)
      for (const auto& rel : rels)
        readers.emplace_back([&, d, rel] {
          try {
            read_whole(work / fmt::format("pair{}-mnt{}", run, d) / rel / "model.neff");
          } catch (const std::exception&) {
            ++failures;
          }
        });
    for (auto& t : readers) t.join();
    double seconds = since(t0);
    mounts.clear();
    if (failures) throw std::runtime_error(fmt::format("s3pair: {} reads failed", failures.load()));
    ++run;
    return std::pair{seconds, compiled_more_than_once(log, graphs.size(), "s3pair")};
  };
  one_against_two(o, makespan, ratio, one, extra);
  return {ratio, one, extra};
}

// 10. A twin on S3: the first open of an entry whose graph a done entry of the bucket
// holds (another name), through a fresh mount, against the first open of that done entry
// through a fresh mount: what the index's check and the server-side copy add to a fetch.
std::vector<Row> bench_s3twin(const Options& o, const fs::path& work) {
  auto env = s3_environment(o);
  auto s3 = s3_bucket(env, fmt::format("bench-twin-{}", ::getpid()));
  const std::string done = "neuronxcc-2.21.0/MODULE_done+twin";
  const std::string graph = neffcache::bench::synthesize_module(4 << 20, 512);
  note(fmt::format("s3twin: uploading a {} MiB NEFF", o.s3_twin_mib));
  write_blob(work / "blob", o.s3_twin_mib << 20);
  need(s3->put(done + "/compile_flags.json", R"(["--target=trn1"])"));
  need(s3->put(done + "/model.hlo_module.pb", graph));
  need(s3->upload(done + "/model.neff", (work / "blob").string()));
  need(s3->put(done + "/model.done", ""));
  fs::remove(work / "blob");
  const std::string url = fmt::format("s3://{}", s3->bucket());
  {  // The done entry in the bucket's index, as a publisher or `neffcache index` leaves it.
    std::vector<std::string> argv{"env"};
    argv.insert(argv.end(), env.begin(), env.end());
    argv.insert(argv.end(), {test::path::tool, "index", "--cache", url});
    auto got = neffcache::detail::run_capture(argv, std::chrono::minutes(5));
    if (!got || got->exit_code != 0) throw std::runtime_error("s3twin: neffcache index failed");
  }
  const fs::path log = work / "twin-compiles.log";
  auto daemon_env = env;
  daemon_env.push_back("NEFFCACHE_FAKE_LOG=" + log.string());
  Row ratio(fmt::format("s3: first open of a twin of a done {} MiB NEFF (served from the bucket's index) / first open "
                        "of the done entry, time", o.s3_twin_mib),
            "ratio");
  Row twin_s("s3: first open of the twin, until open returns", "s");
  Row compiles("s3: compiles for the twins", "count", "0", [](double v) { return v == 0; });
  for (int r = 0; r < o.reps; ++r) {
    const std::string twin = fmt::format("neuronxcc-2.21.0/MODULE_twin{}+twin", r);
    need(s3->put(twin + "/compile_flags.json", R"(["--target=trn1"])"));
    need(s3->put(twin + "/model.hlo_module.pb", graph));
    double plain = 0, served = 0;
    for (bool of_twin : r % 2 == 0 ? std::vector{false, true} : std::vector{true, false}) {
      const fs::path tier = work / fmt::format("twin-tier-{}-{}", r, of_twin);
      Mount m(url, work / "twin-mnt", daemon_env, {"-j", "2", "--local-cache", tier.string()});
      auto t0 = Clock::now();
      const fs::path neff = work / "twin-mnt" / (of_twin ? twin : done) / "model.neff";
      int fd = ::open(neff.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd < 0) throw std::runtime_error(fmt::format("open {}: {}", neff.string(), std::strerror(errno)));
      (of_twin ? served : plain) = since(t0);
      ::close(fd);
      fs::remove_all(tier);
    }
    ratio.samples.push_back(served / plain);
    twin_s.samples.push_back(served);
    auto lines = neffcache::detail::read_file(log.string());  // (one line per compile; none yet: no file)
    compiles.samples.push_back(lines ? static_cast<double>(std::count(lines->begin(), lines->end(), '\n')) : 0.0);
  }
  return {ratio, twin_s, compiles};
}

// 11. A fresh host starting a model on a bucket a region away: every NEFF of the model
// opened in order through a mount (as a client loads its graphs), lazily, each fetched
// at its open, against warm-then-open: `neffcache warm` of the model's manifest into the
// local tier, then the same opens. Both timed from before the daemon starts; the order
// of the two alternates between repetitions.
std::vector<Row> bench_s3warm(const Options& o, const fs::path& work) {
  auto env = s3_environment(o);
  auto& endpoint = *std::find_if(env.begin(), env.end(), [](const auto& e) { return e.starts_with("AWS_ENDPOINT_URL="); });
  test::Child proxy({"python3", std::string(test::path::s3_scripts) + "/faulty_proxy.py",
                     endpoint.substr(endpoint.rfind(':') + 1), "delay", std::to_string(o.s3_delay_ms)},
                    /*quiet_stderr=*/true);
  const std::string port = proxy.line();
  auto slow = env;
  for (auto& e : slow)
    if (e.starts_with("AWS_ENDPOINT_URL=")) e = "AWS_ENDPOINT_URL=http://127.0.0.1:" + port;
  std::vector<Row> rows;
  struct Model {
    std::string what;
    int count;
    uint64_t mib;
  };
  for (const Model& m : {Model{"small", o.warm_small_count, 1}, Model{"large", o.warm_large_count, o.warm_large_mib}}) {
    auto s3 = s3_bucket(env, fmt::format("bench-warm-{}-{}", m.what, ::getpid()));
    note(fmt::format("s3warm: uploading {} NEFFs of {} MiB", m.count, m.mib));
    write_blob(work / "blob", m.mib << 20);
    nlohmann::ordered_json manifest{{"manifest", 1}, {"bucket", fmt::format("s3://{}", s3->bucket())},
                                    {"entries", nlohmann::ordered_json::array()}};
    std::vector<std::string> rels;
    for (int i = 0; i < m.count; ++i) {
      rels.push_back(fmt::format("neuronxcc-2.21.0/MODULE_{}+warm", i));
      need(s3->upload(rels.back() + "/model.neff", (work / "blob").string()));
      need(s3->put(rels.back() + "/model.hlo_module.pb", neffcache::bench::synthesize_module(1 << 10, 512)));
      need(s3->put(rels.back() + "/model.done", ""));
      manifest["entries"].push_back({{"entry", rels.back()}, {"neff_bytes", m.mib << 20}});
    }
    fs::remove(work / "blob");
    const fs::path manifest_file = work / fmt::format("manifest-{}.json", m.what);
    std::ofstream(manifest_file) << manifest.dump(2);
    Row ratio(fmt::format("s3 {} ms away: {} NEFFs of {} MiB opened in order on a fresh host, warm-then-open / lazy, "
                          "time", o.s3_delay_ms, m.count, m.mib),
              "ratio", "<= 0.3", [](double v) { return v <= 0.3; });
    Row lazy_row(fmt::format("s3 {} ms away: {} NEFFs of {} MiB opened lazily", o.s3_delay_ms, m.count, m.mib), "s");
    Row warm_row(fmt::format("s3 {} ms away: the same, warm first (the warm step alone)", o.s3_delay_ms), "s");
    for (int r = 0; r < o.reps; ++r) {
      double lazy = 0, warm = 0;
      for (bool warmed : r % 2 == 0 ? std::vector{false, true} : std::vector{true, false}) {
        const fs::path tier = work / fmt::format("warm-{}-{}-{}", m.what, r, warmed);
        auto t0 = Clock::now();
        if (warmed) {
          std::vector<std::string> argv{"env"};
          argv.insert(argv.end(), slow.begin(), slow.end());
          argv.insert(argv.end(), {test::path::tool, "warm", manifest_file.string(), "--local-cache", tier.string()});
          auto got = neffcache::detail::run_capture(argv, std::chrono::minutes(10));
          if (!got || got->exit_code != 0)
            throw std::runtime_error(fmt::format("neffcache warm failed: {}", got ? got->output : got.error().message));
          warm_row.samples.push_back(since(t0));
        }
        {
          Mount mount(fmt::format("s3://{}", s3->bucket()), work / "warm-mnt", slow,
                      {"-j", "2", "--local-cache", tier.string()});
          for (const auto& rel : rels)
            if (read_whole(work / "warm-mnt" / rel / "model.neff") != m.mib << 20)
              throw std::runtime_error("s3warm: short read");
        }
        (warmed ? warm : lazy) = since(t0);
        fs::remove_all(tier);
      }
      ratio.samples.push_back(warm / lazy);
      lazy_row.samples.push_back(lazy);
    }
    rows.insert(rows.end(), {ratio, lazy_row, warm_row});
  }
  return rows;
}

// 12. A compile farm on CPU hosts: farm processes (`neffcache compile --watch`, --pair-jobs
// compiles each, listing the bucket every second) already watching a bucket when a trial run
// writes the 34-graph workload into it; the makespan, from the first graph written to the
// last model.done, of two farm processes against one, and compiles counted. Each farm process
// stands for a host of its own: its compiles wait instead of burning (NEFFCACHE_FAKE_IDLE), as
// on CPUs of their own, and it has a memory ledger of its own, admitting --pair-jobs compiles
// (--mem-budget off: the fake compiles need no memory). Processes on one host share its
// ledger and budget: with the default budget of this 24 GiB machine they ran one compile at
// a time between them, and two took as long as one (1.06).
std::vector<Row> bench_s3farm(const Options& o, const fs::path& work) {
  auto env = s3_environment(o);
  note(fmt::format("s3farm: synthesizing {} graphs", neffcache::bench::k_workload_graphs));
  auto graphs = neffcache::bench::llama_workload(o.pair_scale, o.pair_rate);
  env.insert(env.end(), {fmt::format("NEFFCACHE_FAKE_RATE={}", o.pair_rate), "NEFFCACHE_FAKE_IDLE=1"});
  Row ratio(fmt::format("s3 farm: makespan of 34 graphs a trial run writes, 2 --watch processes / 1, {} compiles each",
                        o.pair_jobs), "ratio", "<= 0.6", [](double m) { return m <= 0.6; });
  Row one("s3 farm: makespan of 34 graphs, 1 --watch process", "s");
  Row extra("s3 farm: graphs compiled more than once, 2 processes", "count", "0", [](double m) { return m == 0; });
  const std::string fake = fmt::format("{} compile --framework=XLA --target=trn1 {{hlo}} --output {{neff}} {{flags}}",
                                       test::path::fake_compiler);
  int run = 0;
  auto makespan = [&](int farms) {
    auto s3 = s3_bucket(env, fmt::format("bench-farm-{}-{}", ::getpid(), run));
    const fs::path log = work / fmt::format("farm{}.log", run);
    std::vector<std::unique_ptr<test::Child>> farm;
    for (int f = 0; f < farms; ++f) {
      std::vector<std::string> argv{"env"};
      argv.insert(argv.end(), env.begin(), env.end());
      argv.insert(argv.end(), {"NEFFCACHE_FAKE_LOG=" + log.string(), test::path::tool, "compile", "--watch",
                               "--watch-interval", "1", "--cache", fmt::format("s3://{}", s3->bucket()), "--compiler",
                               fake, "-j", std::to_string(o.pair_jobs), "--mem-budget", "off", "--mem-ledger",
                               (work / fmt::format("farm{}-ledger{}", run, f)).string()});
      farm.push_back(std::make_unique<test::Child>(argv, /*quiet_stderr=*/true));
    }
    std::this_thread::sleep_for(std::chrono::seconds(1));  // (each has listed the empty bucket)
    auto t0 = Clock::now();
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      const std::string rel = fmt::format("neuronxcc-2.21.0/MODULE_{}+farm", i);
      need(s3->put(rel + "/compile_flags.json", R"(["--target=trn1"])"));
      need(s3->put(rel + "/model.hlo_module.pb", graphs[i]));
    }
    std::size_t done = 0;
    while (done < graphs.size()) {
      if (since(t0) > 600) throw std::runtime_error(fmt::format("s3farm: {} of {} done after 600 s", done, graphs.size()));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      auto listed = need(s3->list(""));
      done = static_cast<std::size_t>(std::count_if(listed.objects.begin(), listed.objects.end(),
                                                    [](const auto& obj) { return obj.key.ends_with("/model.done"); }));
    }
    double seconds = since(t0);
    for (auto& f : farm) f->kill(SIGTERM);
    for (auto& f : farm)
      if (int rc = f->wait(); rc != 0) throw std::runtime_error(fmt::format("s3farm: a farm process ended with {}", rc));
    ++run;
    return std::pair{seconds, compiled_more_than_once(log, graphs.size(), "s3farm")};
  };
  one_against_two(o, makespan, ratio, one, extra);
  return {ratio, one, extra};
}

// 13. torch-xla ranks on hosts that share a bucket, with no shim: the conformance suite's
// client (tests/conformance/neuron_client.py), which takes an entry's lock itself and writes
// the graph under it. 4 ranks on one host's mount against 2 on each of two mounts of one
// bucket (each daemon with a tier of its own), --hosts-graphs new graphs started at once,
// each rank taking them in order; the time until every rank is done. A second host's ranks
// wait on the lock that stands for the first host's lease, then fetch its NEFF.
std::vector<Row> bench_s3hosts(const Options& o, const fs::path& work) {
  auto env = s3_environment(o);
  const int graphs = o.hosts_graphs;
  constexpr int k_ranks = 4;
  Row ratio(fmt::format("s3: {} torch-xla ranks taking their own locks, {} new graphs at once: 2 hosts x 2 / 1 host x 4, "
                        "time until every rank is done", k_ranks, graphs),
            "ratio", "<= 1.1", [](double v) { return v <= 1.1; });
  Row one(fmt::format("s3: {} ranks, {} new graphs, 1 host", k_ranks, graphs), "s");
  Row extra("s3: graphs compiled more than once, 2 hosts", "count", "0", [](double m) { return m == 0; });
  for (int g = 0; g < graphs; ++g) {
    const fs::path in = work / fmt::format("hosts-inputs-{}", g);
    fs::create_directories(in);
    std::ofstream(in / "model.hlo_module.pb") << neffcache::bench::synthesize_module(64 << 10, 512 + g);
    std::ofstream(in / "compile_flags.json") << R"(["--target=trn1"])";
  }
  int run = 0;
  auto makespan = [&](int hosts) {
    auto s3 = s3_bucket(env, fmt::format("bench-hosts-{}-{}", ::getpid(), run));
    const fs::path log = work / fmt::format("hosts{}.log", run);
    auto daemon_env = env;
    daemon_env.insert(daemon_env.end(), {"NEFFCACHE_FAKE_LOG=" + log.string(), "NEFFCACHE_FAKE_IDLE=1",
                                         fmt::format("NEFFCACHE_FAKE_SECONDS={}", o.hosts_compile_seconds)});
    std::vector<std::unique_ptr<Mount>> mounts;
    for (int h = 0; h < hosts; ++h)
      mounts.push_back(std::make_unique<Mount>(
          fmt::format("s3://{}", s3->bucket()), work / fmt::format("hosts{}-mnt{}", run, h), daemon_env,
          std::vector<std::string>{"-j", "2", "--local-cache", (work / fmt::format("hosts{}-local{}", run, h)).string()}));
    std::atomic<int> errors{0};
    std::mutex say;
    auto t0 = Clock::now();
    std::vector<std::thread> ranks;
    for (int r = 0; r < k_ranks; ++r)
      ranks.emplace_back([&, r] {
        const fs::path mnt = mounts[static_cast<std::size_t>(r % hosts)]->mnt();
        for (int g = 0; g < graphs; ++g) {
          std::vector<std::string> argv{"env"};
          argv.insert(argv.end(), daemon_env.begin(), daemon_env.end());
          argv.insert(argv.end(), {"/usr/bin/python3", test::path::neuron_client, mnt.string(),
                                   fmt::format("neuronxcc-2.21.0/MODULE_{}+hosts", g), "--compiler",
                                   test::path::fake_compiler, "--lock", "excl", "--inputs-from",
                                   (work / fmt::format("hosts-inputs-{}", g)).string()});
          auto got = neffcache::detail::run_capture(argv, std::chrono::minutes(10));
          if (!got || got->exit_code != 0) {
            ++errors;
            std::lock_guard lk(say);
            note(fmt::format("s3hosts: a rank failed: {}", got ? got->output : got.error().message));
          }
        }
      });
    for (auto& t : ranks) t.join();
    const double seconds = since(t0);
    mounts.clear();
    if (errors > 0) throw std::runtime_error(fmt::format("s3hosts: {} rank runs failed", errors.load()));
    ++run;
    return std::pair{seconds, compiled_more_than_once(log, static_cast<std::size_t>(graphs), "s3hosts")};
  };
  one_against_two(o, makespan, ratio, one, extra);
  return {ratio, one, extra};
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"bench_mount: neffcachefs against direct reads of its backing directory, and the cost of waiting"};
  app.add_option("--reps", o.reps, "repetitions of each measurement")->capture_default_str();
  app.add_option("--only", o.only, "run one benchmark")->check(CLI::IsMember({"hit", "small", "meta", "wakeup", "dedup", "overlap", "waiting",
                                                                           "twins", "s3fetch", "s3pair", "s3twin", "s3warm",
                                                                           "s3farm", "s3hosts"}));
  app.add_option("--passthrough-hp", o.passthrough_hp,
                 "libfuse's passthrough_hp example (scripts/private_libs.sh libfuse puts it in PREFIX/bin): small hits through it too");
  app.add_option("--dir", o.dir, "where to build the caches (default: a new folder in /var/tmp)");
  app.add_option("--hit-mib", o.hit_mib, "size of the NEFF of the hit benchmark")->capture_default_str();
  app.add_option("--small-mib", o.small_mib, "size of the NEFF of the small-hit benchmark")->capture_default_str();
  app.add_option("--small-count", o.small_count, "small hits per repetition")->capture_default_str();
  app.add_option("--stat-entries", o.stat_entries, "entries stat'ed")->capture_default_str();
  app.add_option("--walk-entries", o.walk_entries, "entries of the walked cache")->capture_default_str();
  app.add_option("--wake-entries", o.wake_entries, "entries compiled for the wake-up figure")->capture_default_str();
  app.add_option("--dedup-readers", o.dedup_readers, "readers of the one pending entry")->capture_default_str();
  app.add_option("--dedup-compile-seconds", o.dedup_compile_seconds, "the compile's CPU time")->capture_default_str();
  app.add_option("--overlap-graphs", o.overlap_graphs, "graphs of the overlap workload")->capture_default_str();
  app.add_option("--overlap-compile-seconds", o.overlap_compile_seconds, "each graph's compile time there")
      ->capture_default_str();
  app.add_option("--waiting-readers", o.waiting_readers, "readers waiting at once for the footprint figure")
      ->capture_default_str();
  app.add_option("--s3-env", o.s3_env, "the S3 server's s3.env, for s3fetch and s3pair (skipped without it)");
  app.add_option("--s3-neff-mib", o.s3_neff_mib, "size of the NEFF of s3fetch")->capture_default_str();
  app.add_option("--s3-twin-mib", o.s3_twin_mib, "size of the NEFF of s3twin")->capture_default_str();
  app.add_option("--s3-delay-ms", o.s3_delay_ms, "milliseconds added to every S3 request in s3warm")
      ->capture_default_str();
  app.add_option("--warm-small-count", o.warm_small_count, "1 MiB NEFFs of s3warm's small model")->capture_default_str();
  app.add_option("--warm-large-count", o.warm_large_count, "NEFFs of s3warm's large model")->capture_default_str();
  app.add_option("--warm-large-mib", o.warm_large_mib, "their size")->capture_default_str();
  app.add_option("--hosts-graphs", o.hosts_graphs, "new graphs the ranks of s3hosts start at once")->capture_default_str();
  app.add_option("--hosts-compile-seconds", o.hosts_compile_seconds, "each compile's time in s3hosts")
      ->capture_default_str();
  app.add_option("--pair-jobs", o.pair_jobs, "compiles at once per daemon in s3pair, per farm process in s3farm")
      ->capture_default_str();
  app.add_option("--pair-scale", o.pair_scale, "fraction of the real compile times in s3pair and s3farm")
      ->capture_default_str();
  app.add_option("--pair-rate", o.pair_rate, "fake-neuronx-cc instructions per second in s3pair and s3farm")
      ->capture_default_str();
  app.add_option("--twin-neff-mib", o.twins.neff_mib, "size of the done NEFF whose twins are opened")
      ->capture_default_str();
  app.add_option("--twin-graphs", o.twins.graphs, "done graphs of the many-twins figure")->capture_default_str();
  app.add_option("--twins-per-graph", o.twins.per_graph, "twins opened of each of them")->capture_default_str();
  app.add_option("--index-records", o.twins.records, "records of the large content index")->capture_default_str();
  app.add_option("--index-lookups", o.twins.lookups, "timed lookups per repetition and index")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  o.twins.reps = o.reps;
  if (o.reps < 1) return fmt::print(stderr, "bench_mount: --reps must be at least 1\n"), 2;

  std::string work = o.dir;
  if (work.empty()) {
    work = "/var/tmp/neffcache-bench-XXXXXX";
    if (!::mkdtemp(work.data())) return fmt::print(stderr, "bench_mount: cannot create {}\n", work), 1;
  }
  int status = 0;
  fmt::print("| benchmark | median | min | max | unit | runs | goal | met |\n|---|---:|---:|---:|---|---:|---|---|\n");
  using Bench = std::vector<Row> (*)(const Options&, const fs::path&);
  for (auto [name, run] : std::vector<std::pair<std::string, Bench>>{
           {"hit", bench_hit}, {"small", bench_small}, {"meta", bench_meta}, {"wakeup", bench_wakeup},
           {"dedup", bench_dedup}, {"overlap", bench_overlap}, {"waiting", bench_waiting},
           {"twins", [](const Options& o, const fs::path& work) { return bench_twins(o.twins, work); }},
           {"s3fetch", bench_s3fetch}, {"s3pair", bench_s3pair}, {"s3twin", bench_s3twin}, {"s3warm", bench_s3warm},
           {"s3farm", bench_s3farm}, {"s3hosts", bench_s3hosts}}) {
    if (!o.only.empty() && o.only != name) continue;
    if (name.starts_with("s3") && o.s3_env.empty() && o.only.empty()) {
      note(fmt::format("{}: skipped (no --s3-env)", name));
      continue;
    }
    try {
      print_rows(run(o, work));
    } catch (const std::exception& e) {
      fmt::print(stderr, "bench_mount: {}: {}\n", name, e.what());
      status = 1;
    }
  }
  if (o.dir.empty()) fs::remove_all(work);
  return status;
}
