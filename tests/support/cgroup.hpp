// A memory cgroup for a test or a benchmark: a host with less memory, made real. Created
// under cgroup v2 when its memory controller is available, else v1; only processes
// started through wrap() go into it (never the test itself); removed, its processes
// killed first, when it goes out of scope. Root only.
#pragma once

#include <signal.h>
#include <unistd.h>

#include <chrono>
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

  ~MemoryCgroup() {
    namespace fs = std::filesystem;
    for (int i = 0; i < 100; ++i) {
      auto pids = read(file("cgroup.procs"));
      if (pids.find_first_not_of(" \n") == std::string::npos) break;
      std::istringstream in(pids);
      for (pid_t p; in >> p;) ::kill(p, SIGKILL);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ::rmdir(dir_.c_str());
  }
  MemoryCgroup(const MemoryCgroup&) = delete;
  MemoryCgroup& operator=(const MemoryCgroup&) = delete;

  const std::string& dir() const { return dir_; }
  bool v2() const { return v2_; }

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
