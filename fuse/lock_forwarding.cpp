// Lock forwarding (lock_forwarding.hpp).
#include "lock_forwarding.hpp"

#include "caller.hpp"

#include <sys/file.h>

#include <cerrno>
#include <chrono>
#include <thread>

namespace neffcachefs {

void LockForwarding::wait_for_lock(std::unique_ptr<Later> later, std::function<int()> attempt, int again) {
  {
    std::lock_guard lk(mu_);
    ++running_;
  }
  std::thread([this, later = std::move(later), attempt = std::move(attempt), again] {
    int err;
    for (;;) {
      err = attempt();
      if (err != again) break;
      if (later->interrupted() || stop_) {
        err = EINTR;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    later->fail(err);
    std::lock_guard lk(mu_);
    if (--running_ == 0) idle_.notify_all();
  }).detach();
}

Answer<struct flock> LockForwarding::getlk(int fd, struct flock lock) {
  lock.l_pid = 0;  // required for OFD locks
  if (::fcntl(fd, F_OFD_GETLK, &lock) != 0) return Errno{errno};
  return lock;
}

Answer<Ok> LockForwarding::setlk(const Caller& caller, int fd, struct flock lock, bool sleep) {
  lock.l_pid = 0;
  auto attempt = [fd, lock]() mutable { return ::fcntl(fd, F_OFD_SETLK, &lock) == 0 ? 0 : errno; };
  int err = attempt();
  if (sleep && (err == EAGAIN || err == EACCES)) {
    wait_for_lock(caller.keep(), [attempt]() mutable {
      int e = attempt();
      return e == EACCES ? EAGAIN : e;
    });
    return Deferred{};
  }
  if (err) return Errno{err};
  return Ok{};
}

Answer<Ok> LockForwarding::flock(const Caller& caller, int fd, int op) {
  auto attempt = [fd, op] { return ::flock(fd, op | LOCK_NB) == 0 ? 0 : errno; };
  int err = attempt();
  if (err == EWOULDBLOCK && !(op & LOCK_NB)) {
    wait_for_lock(caller.keep(), attempt);
    return Deferred{};
  }
  if (err) return Errno{err};
  return Ok{};
}

Answer<Ok> LockForwarding::flock_shared(const Caller& caller, int fd, int op, std::function<bool()> elsewhere,
                                        std::function<void(bool taken)> settled) {
  const bool nb = (op & LOCK_NB) != 0;
  // Whether this host's lock is free: taken and let go at once, as a probe.
  auto here = [fd, op] {
    if (::flock(fd, op | LOCK_NB) != 0) return errno;
    ::flock(fd, LOCK_UN);
    return 0;
  };
  if (int err = here(); err && (err != EWOULDBLOCK || nb)) return Errno{err};
  // 0: taken; EWOULDBLOCK: held on this host; EINPROGRESS: held by another host.
  auto attempt = [fd, op, here, elsewhere = std::move(elsewhere), settled = std::move(settled)] {
    if (int err = here()) return err;
    if (!elsewhere()) return EINPROGRESS;
    const int err = ::flock(fd, op | LOCK_NB) == 0 ? 0 : errno;
    settled(err == 0);
    return err;
  };
  // (The other hosts are asked on the thread: S3, maybe a fetch, which no FUSE worker waits for.)
  wait_for_lock(
      caller.keep(),
      [attempt, nb, next = std::chrono::steady_clock::time_point{}]() mutable {
        const auto now = std::chrono::steady_clock::now();
        if (now < next) return EINPROGRESS;
        next = now + std::chrono::seconds(1);
        const int err = attempt();
        return err == EWOULDBLOCK && !nb ? EINPROGRESS : err;
      },
      EINPROGRESS);
  return Deferred{};
}

void LockForwarding::stop() {
  std::unique_lock lk(mu_);
  stop_ = true;
  idle_.wait(lk, [&] { return running_ == 0; });
}

int LockForwarding::waiting() {
  std::lock_guard lk(mu_);
  return running_;
}

}  // namespace neffcachefs
