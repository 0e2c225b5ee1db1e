// A memory cgroup for a test or a benchmark: a host with less memory, made real. Created
// under cgroup v2 when its memory controller is available, else v1; only processes
// started through wrap() go into it (never the test itself); removed, its processes
// killed first, when it goes out of scope. Named neffcache-<pid>-<n>, so that
// remove_stale() can remove those of a process that died without cleaning up. Root only.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

namespace test {

class MemoryCgroup {
 public:
  // A cgroup limited to `limit` bytes without swap; nullptr with the reason in `why`.
  static std::unique_ptr<MemoryCgroup> create(uint64_t limit, std::string& why) {
    namespace fs = std::filesystem;
    if (::geteuid() != 0) return why = "needs root", nullptr;
    const std::string name = fmt::format("neffcache-{}-{}", ::getpid(), counter()++);
    for (const char* v2 : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"}) {
      if (read(fmt::format("{}/cgroup.controllers", v2)).find("memory") == std::string::npos) continue;
      write(fmt::format("{}/cgroup.subtree_control", v2), "+memory");
      std::unique_ptr<MemoryCgroup> cg(new MemoryCgroup(fmt::format("{}/{}", v2, name), true));
      std::error_code ec;
      if (!fs::create_directory(cg->dir_, ec)) continue;
      if (write(cg->file("memory.max"), std::to_string(limit)) &&
          (write(cg->file("memory.swap.max"), "0") || !fs::exists(cg->file("memory.swap.max"))))
        return cg;
    }
    if (fs::exists("/sys/fs/cgroup/memory/memory.limit_in_bytes")) {
      std::unique_ptr<MemoryCgroup> cg(new MemoryCgroup("/sys/fs/cgroup/memory/" + name, false));
      std::error_code ec;
      if (fs::create_directory(cg->dir_, ec) && write(cg->file("memory.limit_in_bytes"), std::to_string(limit))) {
        if (fs::exists(cg->file("memory.memsw.limit_in_bytes")))
          write(cg->file("memory.memsw.limit_in_bytes"), std::to_string(limit));
        return cg;
      }
    }
    return why = "no memory cgroup could be created (v2 memory controller or v1 memory hierarchy)", nullptr;
  }

  ~MemoryCgroup() { kill_and_remove(dir_); }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  const std::string& dir() const { return dir_; }
  bool v2() const { return v2_; }

  // Kills every process in it (they stay until reaped by their parents).
  void kill_all() const { kill_members(dir_); }

  // `argv` started inside the cgroup: a shell moves itself in, then becomes the program.
  std::vector<std::string> wrap(const std::vector<std::string>& argv) const {
    std::vector<std::string> out{"sh", "-c", fmt::format("echo $$ > {} && exec \"$@\"", file("cgroup.procs")), "sh"};
    out.insert(out.end(), argv.begin(), argv.end());
    return out;
  }

  // Processes the kernel's out-of-memory killer killed in it so far.
  uint64_t oom_kills() const {
    std::istringstream in(read(file(v2_ ? "memory.events" : "memory.oom_control")));
    std::string key;
    for (uint64_t v; in >> key >> v;)
      if (key == "oom_kill") return v;
    return 0;
  }

  // The most it held at once, bytes (0 when the kernel does not say: v2 before 5.19).
  uint64_t peak() const {
    return std::strtoull(read(file(v2_ ? "memory.peak" : "memory.max_usage_in_bytes")).c_str(), nullptr, 10);
  }

  // Removes the cgroups of this kind left by processes that are gone (killed before
  // their destructors ran), killing what is in them first; returns their paths.
  static std::vector<std::string> remove_stale() {
    namespace fs = std::filesystem;
    std::vector<std::string> removed;
    for (const char* root : {"/sys/fs/cgroup", "/sys/fs/cgroup/unified", "/sys/fs/cgroup/memory"}) {
      std::error_code ec;
      for (const auto& d : fs::directory_iterator(root, ec)) {
        const std::string name = d.path().filename().string();
        int owner = 0, n = 0, end = 0;
        if (std::sscanf(name.c_str(), "neffcache-%d-%d%n", &owner, &n, &end) != 2 ||
            end != static_cast<int>(name.size()) || owner <= 0)
          continue;
        if (::kill(owner, 0) == 0 || errno != ESRCH) continue;  // its owner still runs
        kill_and_remove(d.path().string());
        removed.push_back(d.path().string());
      }
    }
    return removed;
  }

 private:
  MemoryCgroup(std::string dir, bool v2) : dir_(std::move(dir)), v2_(v2) {}
  static int& counter() {
    static int n = 0;
    return n;
  }
  std::string file(const char* name) const { return fmt::format("{}/{}", dir_, name); }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void kill_members(const std::string& dir) {
    std::istringstream in(read(dir + "/cgroup.procs"));
    for (pid_t p; in >> p;) ::kill(p, SIGKILL);
  }
  // Kills its processes until none is left, then removes it (refused while a member is
  // not yet reaped, so retried), for up to 10 s.
  static void kill_and_remove(const std::string& dir) {
    for (int i = 0; i < 500; ++i) {
      if (read(dir + "/cgroup.procs").find_first_not_of(" \n") == std::string::npos) break;
      kill_members(dir);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    for (int i = 0; i < 500 && ::rmdir(dir.c_str()) != 0 && errno == EBUSY; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  static bool write(const std::string& path, const std::string& value) {
    std::ofstream out(path);
    out << value;
    out.flush();
    return static_cast<bool>(out);
  }

  std::string dir_;
  bool v2_;
};

}  // namespace test
