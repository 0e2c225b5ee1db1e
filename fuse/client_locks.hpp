// Lock files that unmodified clients created through the mount, held for them with an
// OFD lock (so other tools see them live) and removed when the creator exits without
// removing them (so they are never stale for hours). A thread of its own (the reaper)
// polls the creators' pidfds.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <neffcache/core/detail/fs.hpp>

namespace neffcachefs {

class ClientLocks {
 public:
  // `removed` is told the path of each lock file the reaper removed (without the mutex).
  explicit ClientLocks(std::function<void(const std::string& path)> removed = {});
  ~ClientLocks();  // stops the reaper
  ClientLocks(const ClientLocks&) = delete;
  ClientLocks& operator=(const ClientLocks&) = delete;

  // Starts the reaper thread (after daemonizing: the fork keeps only the calling thread).
  void start();
  // Stops the reaper and lets go of every hold; clients still alive keep their files.
  void stop();

  // Whether `name` is an entry's lock file name (<hlo>.lock).
  static bool is_lock_name(const char* name);
  // Process `pid` created lock file `name` in folder `dir_fd`: hold it for as long as
  // the process lives (pid 0, a process the daemon cannot see: until the file is
  // removed). Other names are ignored.
  void track(pid_t pid, int dir_fd, const char* name);
  // `name` in `dir_fd` is being removed through the mount: no longer tracked.
  void forget(int dir_fd, const char* name);
  // How many lock files are held (for tests).
  std::size_t held();

 private:
  struct Held {
    std::string path;
    dev_t dev;
    ino_t ino;
    neffcache::detail::UniqueFd pidfd;    // the creating process (-1: already gone, or unseen)
    neffcache::detail::UniqueFd lock_fd;  // our OFD lock on the file
    // Whether its creator can be watched: a client outside the daemon's PID namespace (a
    // daemon in a container of its own) reaches it as pid 0, and its lock stays held until
    // it is removed, as on a disk.
    bool watched = true;
  };
  void wake();
  void reap_loop();

  // Rank 30 (docs/ARCHITECTURE.md): guards held_. Nothing but the reaper's unlink and log line
  // happen under it; never taken with another lock.
  std::mutex mu_;
  std::vector<Held> held_;
  std::function<void(const std::string&)> removed_;
  neffcache::detail::UniqueFd wake_fd_;  // eventfd: the set changed, or stop
  std::atomic<bool> stop_{false};
  std::atomic<bool> told_unseen_{false};  // a creator outside the PID namespace is logged once
  std::thread reaper_;
};

}  // namespace neffcachefs
