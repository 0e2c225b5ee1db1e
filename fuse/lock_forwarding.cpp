// Lock forwarding (lock_forwarding.hpp).
#include "lock_forwarding.hpp"

#include "caller.hpp"

#include <sys/file.h>

#include <cerrno>
#include <chrono>
#include <thread>

namespace neffcachefs {

void LockForwarding::wait_for_lock(std::unique_ptr<Later> later, std::function<int()> attempt) {
  {
    std::lock_guard lk(mu_);
    ++running_;
  }
  std::thread([this, later = std::move(later), attempt = std::move(attempt)] {
    int err;
    for (;;) {
      err = attempt();
      if (err != EAGAIN && err != EWOULDBLOCK) break;
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
