// A daemon serving a bucket through a local tier of its own, for the scope of a test: one
// host of a fleet that shares the bucket. Always unmounted at the end.
#pragma once

#include <csignal>
#include <filesystem>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include "mount.hpp"
#include "s3_support.hpp"
#include "support.hpp"

namespace test {

// What the bucket is to the mount: its cache (with local() as the tier), or a read-only
// layer under local() (--lower s3://...).
enum class BucketAs { cache, lower };

class S3Mount {
 public:
  // `extra`: more daemon options; `env`: more environment for the daemon (and its compiles,
  // whose fake compiler logs each compile to `compile_log`).
  // `before_mount`: what the host does to local() before its daemon starts (a warm start).
  // `host`: a name for a host apart, whose daemon runs in PID, UTS and mount namespaces of
  // its own with that host name, mounted at `at` (hosts apart may share the path, as hosts
  // do); its clients then run through enter(), since its mount is not this process's.
  // None: this machine's, mounted at mnt().
  S3Mount(const std::string& url, const std::filesystem::path& compile_log, std::vector<std::string> extra = {},
          std::vector<std::string> env = {}, BucketAs as = BucketAs::cache,
          const std::function<void(const std::filesystem::path& local)>& before_mount = {}, const std::string& host = {},
          const std::filesystem::path& at = {})
      : mnt_(at.empty() ? dir_ / "mnt" : at) {
    std::filesystem::create_directories(dir_ / "work");
    if (before_mount) before_mount(local());
    env.insert(env.end(), {"TMPDIR=" + (dir_ / "work").string(), "NEFFCACHE_FAKE_LOG=" + compile_log.string(),
                           "NEFFCACHE_FAKE_RATE=0"});
    DaemonSpec spec;
    spec.backing = as == BucketAs::cache ? url : local().string();
    spec.mnt = mnt();
    spec.env = s3_env_words(env);
    spec.options = {"--compiler", k_fake_template, "-j", "2"};
    if (as == BucketAs::cache) spec.options.insert(spec.options.end(), {"--local-cache", local().string()});
    else spec.options.insert(spec.options.end(), {"--lower", url});
    spec.options.insert(spec.options.end(), extra.begin(), extra.end());
    // (--kill-child: the daemon dies with unshare, as a host's processes with the host; its
    // mount goes with the namespace.)
    if (!host.empty()) {
      spec.launcher = {"unshare", "--uts", "--pid", "--mount", "--propagation", "private", "--kill-child",
                       "sh", "-c", "hostname \"$0\" && exec \"$@\"", host};
      spec.own_mounts = true;
      // (A sanitizer build's leak check reads this machine's /proc, whose thread ids are not
      // the namespace's: it would abort the daemon at its exit.)
      spec.env.push_back("ASAN_OPTIONS=detect_leaks=0");
    }
    daemon_.emplace(spec);
    if (!host.empty()) {
      std::istringstream children(slurp(fmt::format("/proc/{}/task/{}/children", daemon_->pid(), daemon_->pid())));
      children >> inner_pid_;
      REQUIRE(inner_pid_ > 0);
    }
  }
  // The words that run a command as a process of this host (its PID and UTS namespaces),
  // before its argv; none for this machine's.
  std::vector<std::string> enter() const {
    if (inner_pid_ <= 0) return {};
    return {"nsenter", "--target", std::to_string(inner_pid_), "--pid", "--uts", "--mount", "--"};
  }
  ~S3Mount() {
    if (auto rc = daemon_->unmount_and_stop()) CHECK(MountedDaemon::clean(*rc));
  }
  S3Mount(const S3Mount&) = delete;
  S3Mount& operator=(const S3Mount&) = delete;

  // Kills the daemon with SIGKILL and takes its dead mount away.
  void kill9() {
    daemon_->stop(SIGKILL);
    if (inner_pid_ <= 0) lazy_unmount(mnt());
  }
  std::filesystem::path mnt() const { return mnt_; }
  std::filesystem::path local() const { return dir_ / "local"; }
  nlohmann::json stats() const { return daemon_->stats(); }

 private:
  TempDir dir_;
  std::filesystem::path mnt_;
  std::optional<MountedDaemon> daemon_;
  pid_t inner_pid_ = 0;  // a host apart: its daemon, as this machine numbers it
};

}  // namespace test
