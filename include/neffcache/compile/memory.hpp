// How much memory compiles may use on this host, and the ledger through which every
// neffcache process on the host shares it.
//
// What the host can give (host_memory): the smaller of its RAM and the memory limit of the
// cgroup this process runs in (v2: memory.max and memory.high, v1: memory.limit_in_bytes,
// each the smallest up the tree). The default budget is k_default_budget_share of it.
//
// The ledger (MemoryLedger): a folder, /dev/shm/neffcache-memory by default, that every
// neffcache process on the host shares. Each process keeps one record there,
// `<pid>-<start time>-<n>`, holding what its running compiles have reserved; every
// admission decision is made under an flock of the folder's `.lock`, from the records of
// processes that still live (a record whose process is gone is not counted, and removed
// when we may). The ledger is cooperative: a process trusts what the others write.
//
// A process whose best compile waits for memory says so in its record (what it needs,
// since when, refreshed at each look; a claim not refreshed for k_wait_claim_ttl lapses).
// Every other process is then told at admission what the one waiting longest needs, and
// starts only what leaves room for it: a large graph waiting in one process is not passed
// for ever by a stream of small ones from another.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <filesystem>
#include <functional>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/core/size.hpp>

namespace neffcache {

inline constexpr const char* k_default_ledger_dir = "/dev/shm/neffcache-memory";
inline constexpr double k_default_budget_share = 0.85;
inline constexpr std::chrono::seconds k_wait_claim_ttl{3};

// The memory this process may count on, and where that figure comes from.
struct HostMemory {
  uint64_t ram = 0;                    // MemTotal
  std::optional<uint64_t> cgroup_max;  // the tightest limit of this process's cgroups
  std::string cgroup;                  // the cgroup that sets it ("" when none does)
  uint64_t limit() const { return cgroup_max ? std::min(ram, *cgroup_max) : ram; }
};

namespace detail {

// A limit file's value: a byte count, or nothing for "max" (v2), an unreadable file, or
// v1's "unlimited" (a page-rounded LONG_MAX).
inline std::optional<uint64_t> read_limit(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::nullopt;
  uint64_t v = 0;
  auto [end, ec] = std::from_chars(text->data(), text->data() + text->size(), v);
  if (ec != std::errc() || end == text->data() || v >= (uint64_t{1} << 62)) return std::nullopt;
  return v;
}

// The tightest of `files` in `path` and each folder above it, up to `mount`.
inline void tightest_limit(const std::string& mount, std::string path, std::initializer_list<const char*> files,
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

// This host's memory and this process's cgroup limits. The roots are parameters for tests.
inline HostMemory host_memory(const std::string& proc = "/proc", const std::string& cgroup_fs = "/sys/fs/cgroup") {
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

inline uint64_t default_mem_budget(const HostMemory& m = host_memory()) {
  return static_cast<uint64_t>(static_cast<double>(m.limit()) * k_default_budget_share);
}

// A --mem-budget value: "off" (admission by count only), a size ("48GiB"), or a share of
// what the host can give ("70%"). Nothing for anything else.
struct MemBudget {
  bool off = false;
  uint64_t bytes = 0;
};
inline std::optional<MemBudget> parse_mem_budget(std::string_view s, const HostMemory& m) {
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

// One process's share of the ledger. Thread-safe. A ledger opened on "" keeps its records
// in this process only: the budget then counts this process's compiles alone.
class MemoryLedger {
 public:
  // A process holding reservations, as the ledger shows it.
  struct Holder {
    int64_t pid = 0;
    std::string program;
    uint64_t reserved = 0;
    std::vector<std::pair<std::string, uint64_t>> compiles;  // what for, how much
    uint64_t waiting = 0;  // what its best compile waits for (0: nothing waits)
    int64_t waiting_since = 0, waiting_seen = 0;  // steady-clock ns: since when, last said
  };

  // One admission, as `choose` sees and answers it.
  struct Admission {
    uint64_t held = 0;   // every live process's reservations, ours included
    uint64_t ahead = 0;  // what the process waiting longest for memory needs, unless it is us
    std::string what;    // answer: what the reservation is for
    uint64_t waiting = 0;  // answer: what our best compile waits for (0: it is not waiting)

    // The one fairness rule of every admission: `n` bytes may be reserved now if they fit
    // beside what is held (anything does when nothing is: a compile larger than the budget
    // runs alone) and leave room for what the process waiting longest needs.
    bool fits(uint64_t n, uint64_t budget) const {
      return (held == 0 || held + n <= budget) && (ahead == 0 || held + n + ahead <= budget);
    }
  };

  // Creates the folder if needed (mode 1777, as /tmp: every user's processes share it).
  static Result<std::shared_ptr<MemoryLedger>> open(const std::string& dir, uint64_t budget,
                                                    std::string program = "neffcache") {
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
    if (fd < 0 && errno == EACCES) fd = ::openat(l->dir_fd_.get(), ".lock", O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    l->lock_fd_ = detail::UniqueFd(fd);
    struct stat st {};
    if (!l->lock_fd_ || ::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
      return Error{Errc::io, fmt::format("memory ledger {}: cannot use its .lock", dir)};
    static std::atomic<int> instances{0};
    l->instance_ = instances++;
    return l;
  }

  ~MemoryLedger() {
    if (dir_fd_ && !record_.empty()) ::unlinkat(dir_fd_.get(), record_.c_str(), 0);
  }
  MemoryLedger(const MemoryLedger&) = delete;
  MemoryLedger& operator=(const MemoryLedger&) = delete;

  uint64_t budget() const { return budget_; }
  const std::string& dir() const { return dir_; }

  // One admission decision, made under the ledger's lock: `choose(Admission&)` is called
  // with what the host holds now and who waits ahead of us, and returns the bytes to
  // reserve (naming in `what` what for), or 0 to reserve nothing (saying in `waiting`
  // what we wait for, if anything). Returns the reservation's id (0 when none was made).
  // `choose` must not take this ledger again.
  template <class Choose>
  uint64_t admit(Choose&& choose) {
    std::lock_guard lk(mu_);
    FileLock flock_guard(lock_fd_.get());
    const int64_t now = steady_ns();
    Admission a;
    const Holder* longest = nullptr;
    const auto others = read_others_locked();
    for (const auto& h : others) {
      a.held += h.reserved;
      if (h.waiting > 0 && now - h.waiting_seen < std::chrono::nanoseconds(k_wait_claim_ttl).count() &&
          (!longest || h.waiting_since < longest->waiting_since))
        longest = &h;
    }
    a.held += mine_locked();
    if (longest && (waiting_ == 0 || longest->waiting_since < waiting_since_)) a.ahead = longest->waiting;
    const uint64_t bytes = choose(a);
    if (a.waiting > 0 && waiting_ == 0) waiting_since_ = now;
    const bool claim_changed = a.waiting != waiting_ || a.waiting > 0;  // a claim is refreshed at each look
    waiting_ = a.waiting;
    if (bytes == 0) {
      if (claim_changed) write_record_locked(now);
      return 0;
    }
    const uint64_t id = ++next_id_;
    mine_[id] = {std::move(a.what), bytes};
    write_record_locked(now);
    return id;
  }

  void release(uint64_t id) {
    if (id == 0) return;
    std::lock_guard lk(mu_);
    if (!mine_.erase(id)) return;
    FileLock flock_guard(lock_fd_.get());
    write_record_locked(steady_ns());
  }

  // What this process holds now.
  uint64_t reserved() const {
    std::lock_guard lk(mu_);
    return mine_locked();
  }

  // Every live process holding reservations, this one included.
  std::vector<Holder> holders() {
    std::lock_guard lk(mu_);
    FileLock flock_guard(lock_fd_.get());
    std::vector<Holder> out = read_others_locked();
    if (!mine_.empty() || waiting_ > 0) out.push_back(mine_as_holder());
    return out;
  }

 private:
  MemoryLedger(uint64_t budget, std::string program) : budget_(budget), program_(std::move(program)) {}

  struct FileLock {
    explicit FileLock(int fd) : fd_(fd) {
      if (fd_ >= 0) detail::retry_eintr([&] { return ::flock(fd_, LOCK_EX); });
    }
    ~FileLock() {
      if (fd_ >= 0) ::flock(fd_, LOCK_UN);
    }
    int fd_;
  };

  uint64_t mine_locked() const {
    uint64_t sum = 0;
    for (const auto& [id, r] : mine_) sum += r.second;
    return sum;
  }

  Holder mine_as_holder() const {
    Holder h{::getpid(), program_, mine_locked(), {}, waiting_, waiting_since_, 0};
    for (const auto& [id, r] : mine_) h.compiles.push_back(r);
    return h;
  }

  // CLOCK_MONOTONIC: one clock for every process of the host.
  static int64_t steady_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

  // Whether the process a record names still lives: same pid and start time. A process
  // whose /proc entry we may not read (hidepid) counts as alive while it exists.
  static bool alive(int64_t pid, uint64_t start) {
    if (auto st = detail::process_start_time(pid)) return *st == start;
    return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == EPERM;
  }

  std::vector<Holder> read_others_locked() {
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

  // Replaces our record whole (a reader never sees half of one), or removes it when we
  // hold nothing and wait for nothing.
  void write_record_locked(int64_t now) {
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

  const uint64_t budget_;
  const std::string program_;
  std::string dir_;
  detail::UniqueFd dir_fd_, lock_fd_;
  std::string record_;  // our record's name, once written
  int instance_ = 0;
  mutable std::mutex mu_;  // this process's side; the flock orders processes
  uint64_t next_id_ = 0;
  std::map<uint64_t, std::pair<std::string, uint64_t>> mine_;
  uint64_t waiting_ = 0;  // what our best compile waits for, as our record says
  int64_t waiting_since_ = 0;
};

// The ledger that --mem-budget and --mem-ledger ask for (empty: NEFFCACHE_MEM_BUDGET and
// NEFFCACHE_MEM_LEDGER, else the default budget and folder); nullptr for "off". A ledger
// folder this process cannot use is reported through `warn` and replaced by one that
// counts this process's compiles only. Errors: a budget that is not off, a size or a share.
inline Result<std::shared_ptr<MemoryLedger>> open_memory_ledger(std::string budget, std::string dir,
                                                                const std::string& program,
                                                                const std::function<void(std::string_view)>& warn,
                                                                const EnvLookup& env = process_env) {
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
