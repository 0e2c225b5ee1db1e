// Definitions of compile/memory.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/memory.hpp>

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::optional<uint64_t> read_limit(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::nullopt;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || end == text->data() || v >= (uint64_t{1} << 62)) return std::nullopt;
  return v;
}

NEFFCACHE_DECL void tightest_limit(const std::string& mount, std::string path, std::initializer_list<const char*> files,
                                   HostMemory& out) {
  for (;;) {
    for (const char* f : files)
      if (auto v = read_limit(fmt::format("{}{}/{}", mount, path == "/" ? "" : path, f)))
        if (!out.cgroup_max || *v < *out.cgroup_max) out.cgroup_max = *v, out.cgroup = path;
    if (path.empty() || path == "/") return;
    auto slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
}

}  // namespace detail

NEFFCACHE_DECL HostMemory host_memory(const std::string& proc, const std::string& cgroup_fs) {
  HostMemory m;
  if (auto info = detail::read_file(proc + "/meminfo")) {
    auto at = info->find("MemTotal:");
    if (at != std::string::npos) m.ram = std::strtoull(info->c_str() + at + 9, nullptr, 10) << 10;
  }
  if (m.ram == 0)
    m.ram = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  auto groups = detail::read_file(proc + "/self/cgroup");
  if (!groups) return m;
  // Lines "ID:CONTROLLERS:PATH": v2's is "0::PATH"; v1's memory line names "memory".
  std::string_view rest = *groups;
  while (!rest.empty()) {
    auto line = rest.substr(0, rest.find('\n'));
    rest.remove_prefix(std::min(rest.size(), line.size() + 1));
    auto c1 = line.find(':'), c2 = line.find(':', c1 == line.npos ? 0 : c1 + 1);
    if (c1 == line.npos || c2 == line.npos) continue;
    auto controllers = line.substr(c1 + 1, c2 - c1 - 1);
    std::string path(line.substr(c2 + 1));
    if (controllers.empty() && line.substr(0, c1) == "0")
      detail::tightest_limit(cgroup_fs, path, {"memory.max", "memory.high"}, m);
    for (std::string_view cs = controllers; !cs.empty();) {
      auto c = cs.substr(0, cs.find(','));
      cs.remove_prefix(std::min(cs.size(), c.size() + 1));
      if (c == "memory") detail::tightest_limit(cgroup_fs + "/memory", path, {"memory.limit_in_bytes"}, m);
    }
  }
  return m;
}

NEFFCACHE_DECL std::optional<MemBudget> parse_mem_budget(std::string_view s, const HostMemory& m) {
  if (s == "off") return MemBudget{true, 0};
  if (!s.empty() && s.back() == '%') {
    double pct = 0;
    auto body = s.substr(0, s.size() - 1);
    auto [end, ec] = std::from_chars(body.data(), body.data() + body.size(), pct);
    if (ec != std::errc() || end != body.data() + body.size() || !(pct > 0) || pct > 100) return std::nullopt;
    return MemBudget{false, static_cast<uint64_t>(static_cast<double>(m.limit()) * pct / 100)};
  }
  auto bytes = parse_size(s);
  if (!bytes || *bytes == 0) return std::nullopt;
  return MemBudget{false, *bytes};
}

NEFFCACHE_DECL Result<std::shared_ptr<MemoryLedger>> MemoryLedger::open(const std::string& dir, uint64_t budget,
                                                                        std::string program) {
  std::shared_ptr<MemoryLedger> l(new MemoryLedger(budget, std::move(program)));
  if (dir.empty()) return l;
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(dir).parent_path(), ec);
  if (::mkdir(dir.c_str(), 01777) == 0) ::chmod(dir.c_str(), 01777);  // not narrowed by the umask
  else if (errno != EEXIST) return sys_error("create memory ledger", dir);
  l->dir_ = dir;
  l->dir_fd_ = detail::UniqueFd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!l->dir_fd_) return sys_error("open memory ledger", dir);
  // Read-only is enough for flock, and all a process may have of another user's file.
  int fd = ::openat(l->dir_fd_.get(), ".lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
  if (fd < 0 && errno == EACCES)
    fd = ::openat(l->dir_fd_.get(), ".lock", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  l->lock_fd_ = detail::UniqueFd(fd);
  struct stat st {};
  if (!l->lock_fd_ || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    return Error{Errc::io, fmt::format("memory ledger {}: cannot use its .lock", dir)};
  static std::atomic<int> instances{0};
  l->instance_ = instances++;
  return l;
}

NEFFCACHE_DECL MemoryLedger::~MemoryLedger() {
  if (dir_fd_ && !record_.empty()) ::unlinkat(dir_fd_.get(), record_.c_str(), 0);
}

NEFFCACHE_DECL void MemoryLedger::release(uint64_t id) {
  if (id == 0) return;
  std::lock_guard lk(mu_);
  if (!mine_.erase(id)) return;
  FileLock flock_guard(lock_fd_.get());
  write_record_locked(steady_ns());
}

NEFFCACHE_DECL std::vector<MemoryLedger::Holder> MemoryLedger::holders() {
  std::lock_guard lk(mu_);
  FileLock flock_guard(lock_fd_.get());
  std::vector<Holder> out = read_others_locked();
  if (!mine_.empty() || waiting_ > 0) out.push_back(mine_as_holder());
  return out;
}

NEFFCACHE_DECL MemoryLedger::FileLock::FileLock(int fd) : fd_(fd) {
  if (fd_ >= 0) detail::retry_eintr([&] { return ::flock(fd_, LOCK_EX); });
}

NEFFCACHE_DECL MemoryLedger::FileLock::~FileLock() {
  if (fd_ >= 0) ::flock(fd_, LOCK_UN);
}

NEFFCACHE_DECL MemoryLedger::Holder MemoryLedger::mine_as_holder() const {
  Holder h{::getpid(), program_, mine_locked(), {}, waiting_, waiting_since_, 0};
  for (const auto& [id, r] : mine_) h.compiles.push_back(r);
  return h;
}

NEFFCACHE_DECL bool MemoryLedger::alive(int64_t pid, uint64_t start) {
  if (auto st = detail::process_start_time(pid)) return *st == start;
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == EPERM;
}

NEFFCACHE_DECL std::vector<MemoryLedger::Holder> MemoryLedger::read_others_locked() {
  std::vector<Holder> out;
  if (!dir_fd_) return out;
  int fd = ::openat(dir_fd_.get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR* d = fd >= 0 ? ::fdopendir(fd) : nullptr;
  if (!d) {
    if (fd >= 0) ::close(fd);
    return out;
  }
  while (auto* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name.empty() || name[0] == '.' || (!record_.empty() && name == record_)) continue;
    int64_t pid = 0;
    uint64_t start = 0;
    auto dash = name.find('-');
    if (dash == name.npos) continue;
    auto r1 = std::from_chars(name.data(), name.data() + dash, pid);
    auto r2 = std::from_chars(name.data() + dash + 1, name.data() + name.size(), start);
    if (r1.ec != std::errc() || r2.ec != std::errc() || pid <= 0) continue;
    if (!alive(pid, start)) {
      ::unlinkat(dir_fd_.get(), e->d_name, 0);  // fails for another user's: then only ignored
      continue;
    }
    int rfd = ::openat(dir_fd_.get(), e->d_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (rfd < 0) continue;
    detail::UniqueFd owned(rfd);
    char buf[16384];
    ssize_t n = detail::retry_eintr([&] { return ::read(rfd, buf, sizeof buf); });
    if (n <= 0) continue;
    auto j = nlohmann::json::parse(std::string_view(buf, static_cast<std::size_t>(n)), nullptr, false);
    if (!j.is_object()) continue;
    Holder h;
    h.pid = pid;
    h.program = j.value("program", "");
    h.reserved = j.value("reserved", uint64_t{0});
    if (auto c = j.find("compiles"); c != j.end() && c->is_array())
      for (const auto& x : *c)
        if (x.is_object()) h.compiles.emplace_back(x.value("for", ""), x.value("bytes", uint64_t{0}));
    h.waiting = j.value("waiting", uint64_t{0});
    h.waiting_since = j.value("waiting_since", int64_t{0});
    h.waiting_seen = j.value("waiting_seen", int64_t{0});
    out.push_back(std::move(h));
  }
  ::closedir(d);
  return out;
}

NEFFCACHE_DECL void MemoryLedger::write_record_locked(int64_t now) {
  if (!dir_fd_) return;
  // Named when first written, by the process that writes it (a daemon forks into the
  // background after opening its ledger).
  if (record_.empty()) {
    const auto me = detail::current_process();
    record_ = fmt::format("{}-{}-{}", me.pid, me.start_time, instance_);
  }
  if (mine_.empty() && waiting_ == 0) {
    ::unlinkat(dir_fd_.get(), record_.c_str(), 0);
    return;
  }
  Holder h = mine_as_holder();
  nlohmann::json compiles = nlohmann::json::array();
  for (const auto& [what, bytes] : h.compiles) compiles.push_back({{"for", what}, {"bytes", bytes}});
  nlohmann::json record{{"program", program_}, {"budget", budget_}, {"reserved", h.reserved}, {"compiles", compiles}};
  if (waiting_ > 0) {
    record["waiting"] = waiting_;
    record["waiting_since"] = waiting_since_;
    record["waiting_seen"] = now;
  }
  const std::string body = record.dump();
  const std::string tmp = "." + record_;
  ::unlinkat(dir_fd_.get(), tmp.c_str(), 0);
  int fd = ::openat(dir_fd_.get(), tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return;
  detail::UniqueFd owned(fd);
  bool ok = detail::write_all(fd, body, "memory ledger record").has_value();
  owned.reset();
  if (ok && ::renameat(dir_fd_.get(), tmp.c_str(), dir_fd_.get(), record_.c_str()) == 0) return;
  ::unlinkat(dir_fd_.get(), tmp.c_str(), 0);
}

NEFFCACHE_DECL Result<std::shared_ptr<MemoryLedger>> open_memory_ledger(
    std::string budget, std::string dir, const std::string& program,
    const std::function<void(std::string_view)>& warn, const EnvLookup& env) {
  if (budget.empty()) budget = env("NEFFCACHE_MEM_BUDGET").value_or("");
  if (dir.empty()) dir = env("NEFFCACHE_MEM_LEDGER").value_or(k_default_ledger_dir);
  const HostMemory host = host_memory();
  MemBudget b{false, default_mem_budget(host)};
  if (!budget.empty()) {
    auto parsed = parse_mem_budget(budget, host);
    if (!parsed)
      return Error{Errc::invalid_argument,
                   fmt::format("--mem-budget '{}': expected off, a size (48GiB) or a share (70%)", budget)};
    b = *parsed;
  }
  if (b.off) return std::shared_ptr<MemoryLedger>();
  auto ledger = MemoryLedger::open(dir, b.bytes, program);
  if (ledger) return ledger;
  if (warn) warn(fmt::format("{}; the memory budget counts this process's compiles only", ledger.error().message));
  return MemoryLedger::open("", b.bytes, program);
}

}  // namespace neffcache
