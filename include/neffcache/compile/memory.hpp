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

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <neffcache/core/decl.hpp>
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
NEFFCACHE_DECL std::optional<uint64_t> read_limit(const std::string& path);

// The tightest of `files` in `path` and each folder above it, up to `mount`.
NEFFCACHE_DECL void tightest_limit(const std::string& mount, std::string path, std::initializer_list<const char*> files,
                                   HostMemory& out);

}  // namespace detail

// This host's memory and this process's cgroup limits. The roots are parameters for tests.
NEFFCACHE_DECL HostMemory host_memory(const std::string& proc = "/proc",
                                      const std::string& cgroup_fs = "/sys/fs/cgroup");

inline uint64_t default_mem_budget(const HostMemory& m = host_memory()) {
  return static_cast<uint64_t>(static_cast<double>(m.limit()) * k_default_budget_share);
}

// A --mem-budget value: "off" (admission by count only), a size ("48GiB"), or a share of
// what the host can give ("70%"). Nothing for anything else.
struct MemBudget {
  bool off = false;
  uint64_t bytes = 0;
};
NEFFCACHE_DECL std::optional<MemBudget> parse_mem_budget(std::string_view s, const HostMemory& m);

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
                                                    std::string program = "neffcache");

  ~MemoryLedger();
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

  void release(uint64_t id);

  // What this process holds now.
  uint64_t reserved() const {
    std::lock_guard lk(mu_);
    return mine_locked();
  }

  // Every live process holding reservations, this one included.
  std::vector<Holder> holders();

 private:
  MemoryLedger(uint64_t budget, std::string program) : budget_(budget), program_(std::move(program)) {}

  struct FileLock {
    explicit FileLock(int fd);
    ~FileLock();
    int fd_;
  };

  uint64_t mine_locked() const {
    uint64_t sum = 0;
    for (const auto& [id, r] : mine_) sum += r.second;
    return sum;
  }

  Holder mine_as_holder() const;

  // CLOCK_MONOTONIC: one clock for every process of the host.
  static int64_t steady_ns() { return std::chrono::steady_clock::now().time_since_epoch().count(); }

  // Whether the process a record names still lives: same pid and start time. A process
  // whose /proc entry we may not read (hidepid) counts as alive while it exists.
  static bool alive(int64_t pid, uint64_t start);

  std::vector<Holder> read_others_locked();

  // Replaces our record whole (a reader never sees half of one), or removes it when we
  // hold nothing and wait for nothing.
  void write_record_locked(int64_t now);

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
NEFFCACHE_DECL Result<std::shared_ptr<MemoryLedger>> open_memory_ledger(
    std::string budget, std::string dir, const std::string& program,
    const std::function<void(std::string_view)>& warn, const EnvLookup& env = process_env);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/memory.ipp>
#endif
