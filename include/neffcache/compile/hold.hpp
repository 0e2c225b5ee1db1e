// What holds an entry while it is compiled, whoever compiles it: its entry lock (a folder
// entry: our lock file, or LNL's flock) or its lease (an S3 entry: s3/cache.hpp's
// LeaseHold). A hold is kept alive from the moment it is taken to the moment it is given
// back (KeepAlive), whatever step the compile is in: a lock left without heartbeats, or a
// lease without renewals, while the compile waits for memory or downloads its inputs,
// would pass to another process or host, which would compile the graph too.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include <neffcache/cache/lock.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// A held entry. Not copied or moved: the compile that took it owns it (in a unique_ptr)
// until it gives it back.
class EntryHold {
 public:
  EntryHold() = default;
  EntryHold(const EntryHold&) = delete;
  EntryHold& operator=(const EntryHold&) = delete;
  virtual ~EntryHold() = default;

  // What is held, in messages: the lock file's path, the lease's key.
  virtual std::string describe() const = 0;
  // The descriptor a compiler inherits so that the hold outlives us should we die first
  // (a lock's open file, RunSpec::inherit_fd); -1 when nothing can be inherited (a lease).
  virtual int descriptor() const { return -1; }
  // How often beat() must run.
  virtual std::chrono::milliseconds beat_every() const = 0;
  // Refreshes the hold: a lock's heartbeat, a lease's renewal. An error says why; lost()
  // then says whether the hold is gone for good (the lock file no longer ours, the lease
  // taken over or removed): its holder must stop and publish nothing. Any other error (the
  // network) is tried again at the next beat.
  NEFFCACHE_DECL Result<void> beat();
  // A beat found the hold gone, and why. Safe to ask from any thread.
  bool lost() const { return lost_; }
  NEFFCACHE_DECL std::string lost_why() const;
  // Gives the hold back once the compile is through: a lock is released; a lease is
  // finished (S3Lease::finish: deleted when the entry is settled, else released). A hold
  // already lost is someone else's: left alone. Called once, with no KeepAlive running.
  virtual void finish(bool settled) = 0;

 protected:
  // One refresh (see beat), and whether its error means the hold is gone for good.
  virtual Result<void> refresh() = 0;
  virtual bool gone(const Error& e) const = 0;

 private:
  std::atomic<bool> lost_ = false;
  mutable std::mutex mu_;  // guards why_
  std::string why_;
};

// A folder entry's lock as a hold.
class LockHold final : public EntryHold {
 public:
  // `every`: the heartbeat interval (LockOptions::heartbeat_interval() of the options the
  // lock was taken with).
  LockHold(EntryLock lock, std::chrono::milliseconds every) : lock_(std::move(lock)), every_(every) {}
  std::string describe() const override { return lock_.path(); }
  int descriptor() const override { return lock_.descriptor(); }
  std::chrono::milliseconds beat_every() const override { return every_; }
  void finish(bool /*settled*/) override { lock_.release(); }

 private:
  Result<void> refresh() override { return lock_.heartbeat(); }
  // (Errc::busy: the lock file is no longer ours; a failed futimens is tried again.)
  bool gone(const Error& e) const override { return e.code == Errc::busy; }

  EntryLock lock_;
  std::chrono::milliseconds every_;
};

// Beats a hold every beat_every() on a thread of its own, from construction (the first
// beat one interval later) to destruction, which waits for a beat under way (a renewal:
// at most the S3 client's timeout) but not for the thread to end: it ends on its own and
// touches nothing but the state it shares, so that giving a hold back (and the answer to
// whoever waits for the compile) does not wait for a thread's exit. (A program that returns
// from main at once after a give-back may end while that thread still ends: harmless to
// the hold; give-back itself, a lock file removed or an S3 request, outlasts it in practice.)
// Meanwhile nothing else beats or finishes the hold but beat_now().
class [[nodiscard]] KeepAlive {
 public:
  NEFFCACHE_DECL explicit KeepAlive(EntryHold& hold);
  NEFFCACHE_DECL ~KeepAlive();
  KeepAlive(const KeepAlive&) = delete;
  KeepAlive& operator=(const KeepAlive&) = delete;

  // One beat now, in turn with the thread's (before a publish: still ours?).
  NEFFCACHE_DECL Result<void> beat_now();

 private:
  struct Shared {
    Shared(EntryHold& h, std::chrono::milliseconds e) : hold(h), every(e) {}
    EntryHold& hold;  // used only under mu, while !done
    const std::chrono::milliseconds every;
    std::mutex mu;  // held by each beat; guards done
    std::condition_variable cv;
    bool done = false;
  };
  std::shared_ptr<Shared> shared_;
};

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/hold.ipp>
#endif
