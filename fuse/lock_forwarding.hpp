// Lock forwarding: a client's POSIX lock becomes an OFD lock, and its flock a flock, on
// this daemon's descriptor of the backing file, so a client locking through the mount
// and a tool locking the backing file see each other. (An OFD lock belongs to one open
// file, not to a process: two opens by one client conflict, which POSIX would not do.)
//
// A lock that must wait is retried on a thread of its own, so no FUSE worker is parked;
// an interrupt from the client, or stop(), ends the wait with EINTR.
#pragma once

#include <fcntl.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>

#include "reply.hpp"

namespace neffcachefs {

class Caller;

class LockForwarding {
 public:
  ~LockForwarding() { stop(); }

  // F_GETLK on the open file `fd`.
  Answer<struct flock> getlk(int fd, struct flock lock);
  // F_SETLK/F_SETLKW; `sleep`: wait for the lock (Deferred: the caller's request is kept
  // and answered later).
  Answer<Ok> setlk(const Caller& caller, int fd, struct flock lock, bool sleep);
  // flock(2) with `op` (LOCK_SH, LOCK_EX, LOCK_UN, maybe LOCK_NB).
  Answer<Ok> flock(const Caller& caller, int fd, int op);
  // flock(2) LOCK_EX of a lock that other hosts take too (an LNL key's, on a bucket mount).
  // A lock held on this host answers as on a disk (LOCK_NB at once). Else, on a thread of
  // its own, `elsewhere()` takes the hold on the other hosts, and says false while another
  // host has it: the client waits, with LOCK_NB too, for as long as that host holds it
  // (asked again once a second). Then this host's lock is taken, and `settled` is told
  // whether it was. (The other hosts are asked without this host's lock: a rank of this
  // host that finds it taken reads its holder's file at once, which the holder writes only
  // once it has the lock.)
  Answer<Ok> flock_shared(const Caller& caller, int fd, int op, std::function<bool()> elsewhere,
                          std::function<void(bool taken)> settled);
  // Ends every wait with EINTR and returns when all of them have answered (while the
  // session can still carry the replies). Later waits end at once.
  void stop();
  // How many waits are under way (for tests).
  int waiting();

 private:
  // Retries `attempt` (which returns 0, `again` to wait on, or an errno) on a thread.
  void wait_for_lock(std::unique_ptr<Later> later, std::function<int()> attempt, int again = EAGAIN);

  // Rank 80 (docs/ARCHITECTURE.md): guards running_. A leaf.
  std::mutex mu_;
  std::condition_variable idle_;
  int running_ = 0;
  std::atomic<bool> stop_{false};
};

}  // namespace neffcachefs
