// neffcachefs mounted for a scope: the one way the mount tests and the mount benchmarks
// start a daemon, wait for its mount, look at it from /proc and take it down. Free of
// Catch2 (a daemon that does not mount throws), so that the benchmarks use it too.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "paths.hpp"
#include "process.hpp"

namespace test {

// Whether `dir` is a mount point now.
inline bool mounted(const std::filesystem::path& dir) {
  struct stat a {}, b {};
  return ::stat(dir.c_str(), &a) == 0 && ::stat((dir / "..").c_str(), &b) == 0 && a.st_dev != b.st_dev;
}

// Waits up to `limit` for a daemon just started to mount `dir`; whether it did.
inline bool wait_for_mount(const std::filesystem::path& dir,
                           std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  auto end = std::chrono::steady_clock::now() + limit;
  while (!mounted(dir)) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

// Whether the process `pid` sees a mount at `dir` (its mount namespace's table).
inline bool mounted_for(pid_t pid, const std::filesystem::path& dir) {
  std::ifstream in(fmt::format("/proc/{}/mountinfo", pid));
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string id, parent, dev, root, point;
    if (fields >> id >> parent >> dev >> root >> point && point == dir.string()) return true;
  }
  return false;
}

// A /proc file's text ("" when it cannot be read).
inline std::string slurp_proc(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Unmounts `dir` lazily (a dead daemon's mount included); quiet when nothing is mounted.
inline void lazy_unmount(const std::filesystem::path& dir) {
  Child c({"fusermount3", "-u", "-z", dir.string()}, /*quiet_stderr=*/true);
  c.rest();
  c.wait();
}

// A number from /proc/PID/status (`key` such as "VmRSS:", "VmHWM:", "Threads:"); -1 if
// the process or the line is gone. Sizes are in KiB there.
inline long proc_status(pid_t pid, std::string_view key) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  for (std::string line; std::getline(in, line);)
    if (line.starts_with(key)) return std::stol(line.substr(key.size()));
  return -1;
}

// How a daemon is started: `launcher words... env ENV... neffcachefs --foreground
// OPTIONS... BACKING MOUNTPOINT`.
struct DaemonSpec {
  std::string backing;                // a folder or an s3:// URL
  std::filesystem::path mnt;          // created if missing
  std::vector<std::string> env;       // words for env(1): NAME=value, or -u NAME
  std::vector<std::string> options;   // the daemon's options
  std::vector<std::string> launcher;  // words before everything (prlimit and the like)
  bool quiet = false;                 // the daemon's stderr to /dev/null (benchmarks)
  // The launcher gives the daemon a mount namespace of its own: its mount is not this
  // process's (found in the launcher's /proc mount table, gone with the namespace).
  bool own_mounts = false;
  std::string program = test::path::daemon;
};

class MountedDaemon {
 public:
  explicit MountedDaemon(const DaemonSpec& s) : mnt_(s.mnt), own_mounts_(s.own_mounts) {
    std::filesystem::create_directories(mnt_);
    std::vector<std::string> argv = s.launcher;
    argv.push_back("env");
    argv.insert(argv.end(), s.env.begin(), s.env.end());
    argv.insert(argv.end(), {s.program, "--foreground"});
    argv.insert(argv.end(), s.options.begin(), s.options.end());
    argv.insert(argv.end(), {s.backing, mnt_.string()});
    auto t0 = std::chrono::steady_clock::now();
    child_ = std::make_unique<Child>(argv, s.quiet);
    bool up = !own_mounts_ && wait_for_mount(mnt_);
    for (int i = 0; own_mounts_ && i < 2000 && !(up = mounted_for(child_->pid(), mnt_)); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!up) {
      child_.reset();  // killed and reaped
      throw std::runtime_error(fmt::format("{} did not mount {}", s.program, mnt_.string()));
    }
    mount_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  ~MountedDaemon() { unmount_and_stop(); }
  MountedDaemon(const MountedDaemon&) = delete;
  MountedDaemon& operator=(const MountedDaemon&) = delete;

  // Unmounts lazily and stops the daemon with SIGTERM if it still runs: its exit code, or
  // -signal (death by SIGTERM after the unmount ended its loop is a clean stop too).
  // Nothing when it was stopped already.
  std::optional<int> unmount_and_stop() {
    if (child_ && !own_mounts_) answer_late_interrupts();
    if (!own_mounts_) lazy_unmount(mnt_);
    if (!child_) return std::nullopt;
    if (own_mounts_) {
      // The launcher (unshare) ignores SIGTERM while it waits for its child: the daemon,
      // which unmounts and exits on it, gets it, and the launcher exits with its status.
      std::istringstream children(slurp_proc(fmt::format("/proc/{}/task/{}/children", pid(), pid())));
      pid_t inner = 0;
      if (!(children >> inner && inner > 0)) return stop(SIGKILL);  // (--kill-child: the daemon too)
      ::kill(inner, SIGTERM);
      int rc = child_->wait();
      child_.reset();
      return rc;
    }
    return stop(SIGTERM);
  }
  // Sends `sig` and waits: the exit code, or -signal. The mount may stay behind (kill -9).
  int stop(int sig) {
    child_->kill(sig);
    int rc = child_->wait();
    child_.reset();
    return rc;
  }
  // Whether `rc` (from unmount_and_stop or stop(SIGTERM)) is a clean stop: a sanitizer's
  // report in the daemon (a leak found at exit) is not.
  static bool clean(int rc) { return rc == 0 || rc == -SIGTERM; }

  const std::filesystem::path& mnt() const { return mnt_; }
  Child& process() { return *child_; }
  pid_t pid() const { return child_ ? child_->pid() : -1; }
  double mount_seconds() const { return mount_seconds_; }
  double rss_mib() const { return static_cast<double>(proc_status(pid(), "VmRSS:")) / 1024.0; }
  long peak_rss_kib() const { return proc_status(pid(), "VmHWM:"); }
  int threads() const { return static_cast<int>(proc_status(pid(), "Threads:")); }
  int fds() const {
    std::error_code ec;
    auto it = std::filesystem::directory_iterator(fmt::format("/proc/{}/fd", pid()), ec);
    return ec ? -1 : static_cast<int>(std::distance(it, std::filesystem::directory_iterator()));
  }
  // The daemon's counters, as a client reads them.
  nlohmann::json stats() const {
    std::ifstream in(mnt_ / ".neffcache" / "stats.json");
    return nlohmann::json::parse(in);
  }

 private:
  // libfuse keeps an INTERRUPT that it reads after its request was answered (a killed
  // client's FLUSH: its exit closes its files) until the next request comes, then answers
  // it EAGAIN; the session's end frees none (3.14 here, and upstream's code in 2026), a
  // leak LeakSanitizer reports in the daemon. A few requests before the unmount let it
  // answer them. (In a timeout: a test may leave a daemon that answers nothing.)
  void answer_late_interrupts() {
    std::vector<std::string> argv{"timeout", "10", "stat"};
    for (int i = 0; i < 4; ++i) argv.push_back((mnt_ / fmt::format("unmount-probe-{}", i)).string());
    Child c(argv, /*quiet_stderr=*/true);
    c.rest();
    c.wait();
  }

  std::filesystem::path mnt_;
  bool own_mounts_ = false;
  std::unique_ptr<Child> child_;
  double mount_seconds_ = 0;
};

}  // namespace test
