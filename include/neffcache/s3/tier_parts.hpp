// The parts of the local tier over S3 (s3/tier.hpp) that hold state, each behind a mutex
// of its own that is never held across a request to S3 or a file operation: the recent
// looks at S3, the NEFFs kept under the size cap, the leases held for clients, and the
// compile slots.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <neffcache/core/decl.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/compile/hold.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/lease.hpp>

namespace neffcache::detail {

// When each name was last looked up on S3, and the looks under way.
class RecentLooks {
 public:
  // Names asked for again within this time are answered from the last look at S3.
  static constexpr std::chrono::seconds k_recheck{2};

  // True (and noted) unless `what` was looked up within k_recheck.
  bool again(const std::string& what);
  // The next look at `what` goes to S3, however recent the last one.
  void forget(const std::string& what) {
    std::lock_guard lk(mu_);
    looked_.erase(what);
  }
  // Runs look() for `what` unless it is running already: then waits for its answer.
  // Lookups of two names in one entry (model.neff and model.done) come at once.
  bool single_flight(const std::string& what, const std::function<bool()>& look);

 private:
  std::mutex mu_;
  std::map<std::string, std::chrono::steady_clock::time_point> looked_;
  std::map<std::string, std::shared_future<bool>> in_flight_;
};

// The NEFFs of the tier's entries and their last use, under a cap on their bytes.
class KeptNeffs {
 public:
  // An entry used within `keep_after_use` stays, whatever the cap: a reader may be about
  // to open the NEFF it was just fetched for.
  KeptNeffs(uint64_t cap_bytes, std::chrono::seconds keep_after_use)
      : cap_bytes_(cap_bytes), keep_after_use_(keep_after_use) {}

  // The done entries of the folder `root` from an earlier run, each last used when its
  // NEFF last changed.
  void scan(const std::string& root);
  // Counts the NEFF of `entry_dir` (`bytes`) as used now. The entries to evict, least
  // recently used first, to come under the cap: no longer counted.
  std::vector<std::string> keep(const std::string& entry_dir, uint64_t bytes);
  // A reader opened the entry's NEFF: it stays longest.
  void opened(const std::string& entry_dir) {
    std::lock_guard lk(mu_);
    if (auto it = kept_.find(entry_dir); it != kept_.end()) it->second.last_use = std::chrono::steady_clock::now();
  }
  uint64_t bytes() const;

 private:
  struct Kept {
    uint64_t bytes = 0;
    std::chrono::steady_clock::time_point last_use;
  };
  const uint64_t cap_bytes_;
  const std::chrono::seconds keep_after_use_;
  mutable std::mutex mu_;
  std::map<std::string, Kept> kept_;
};

// The S3 leases held for clients of this host that compile an entry themselves, by
// entry folder, each renewed on a thread of its own from the moment it is taken (a
// KeepAlive: the scheduler's looks at a busy entry may wait behind long compiles for a
// worker, longer than a lease lives). Those still held at the end are given back: other
// hosts need not wait out their ttl.
class StandIns {
 public:
  struct Held {
    std::chrono::system_clock::time_point since = std::chrono::system_clock::now();  // taken
    std::unique_ptr<LeaseHold> hold;
    std::unique_ptr<KeepAlive> alive;  // (declared last: stops beating before the hold goes)

    // A lease just taken, renewed from now on.
    explicit Held(S3Lease lease)
        : hold(std::make_unique<LeaseHold>(std::move(lease))), alive(std::make_unique<KeepAlive>(*hold)) {}
    // The lease, no longer renewed here (nullopt when a renewal found it taken over).
    std::optional<S3Lease> end() {
      alive.reset();
      if (hold->lost()) return std::nullopt;
      return hold->take();
    }
  };

  StandIns() = default;
  ~StandIns() {
    for (auto& [entry, held] : held_)
      if (auto lease = held.end()) (void)lease->release();
  }
  StandIns(const StandIns&) = delete;
  StandIns& operator=(const StandIns&) = delete;

  // The lease held for `entry_dir`, no longer held here (the caller ends it).
  std::optional<Held> take(const std::string& entry_dir);
  // Holds `held` for `entry_dir`. One lease per entry: the one held already stays unless
  // a renewal found it lost, and the other is given back at once (other hosts need not
  // wait out its ttl).
  NEFFCACHE_DECL void put(const std::string& entry_dir, Held held);
  // Whether a lease is held for `entry_dir`: nullopt when none, false when a renewal
  // found it lost (it is no longer held then: another host has the entry).
  NEFFCACHE_DECL std::optional<bool> live(const std::string& entry_dir);
  bool holds(const std::string& entry_dir) const {
    std::lock_guard lk(mu_);
    return held_.contains(entry_dir);
  }
  // When the lease held for `entry_dir` was taken; nullopt when none is, or it was lost.
  std::optional<std::chrono::system_clock::time_point> since(const std::string& entry_dir) const {
    std::lock_guard lk(mu_);
    auto it = held_.find(entry_dir);
    if (it == held_.end() || it->second.hold->lost()) return std::nullopt;
    return it->second.since;
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, Held> held_;
};

// At most `slots` compiles at once. A Slot is held for one compile and given back when it
// goes out of scope.
class CompileSlots {
 public:
  class Slot {
   public:
    Slot(Slot&& o) noexcept : of_(std::exchange(o.of_, nullptr)) {}
    Slot& operator=(Slot&&) = delete;
    ~Slot() {
      if (of_) of_->give();
    }

   private:
    friend class CompileSlots;
    explicit Slot(CompileSlots& of) : of_(&of) {}
    CompileSlots* of_;
  };

  explicit CompileSlots(int slots) : free_(slots) {}
  // Waits for a free slot; none once `cancelled` says so (asked every 100 ms, without
  // the mutex).
  std::optional<Slot> take(const std::function<bool()>& cancelled);

 private:
  void give();

  std::mutex mu_;
  std::condition_variable cv_;
  int free_;
};

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/tier_parts.ipp>
#endif
