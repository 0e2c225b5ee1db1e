// Client lock files (client_locks.hpp).
#include "client_locks.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstdio>
#include <string_view>

#include <fmt/format.h>

#include <neffcache/cache/layout.hpp>

#include "entry_view.hpp"
#include "inode_table.hpp"

namespace neffcachefs {

using neffcache::detail::UniqueFd;

ClientLocks::ClientLocks(std::function<void(const std::string& path)> removed)
    : removed_(std::move(removed)), wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

ClientLocks::~ClientLocks() { stop(); }

void ClientLocks::start() { reaper_ = std::thread([this] { reap_loop(); }); }

void ClientLocks::stop() {
  stop_ = true;
  wake();
  if (reaper_.joinable()) reaper_.join();
  std::lock_guard lk(mu_);
  held_.clear();  // closes the pidfds and our holds
}

void ClientLocks::wake() {
  uint64_t one = 1;
  (void)!::write(wake_fd_.get(), &one, sizeof one);
}

bool ClientLocks::is_lock_name(const char* name) {
  std::string_view n = name;
  return n.ends_with(neffcache::k_lock_suffix) && is_hlo_name(n.substr(0, n.size() - neffcache::k_lock_suffix.size()));
}

void ClientLocks::track(pid_t pid, int dir_fd, const char* name) {
  if (!is_lock_name(name)) return;
  const bool watched = pid > 0;
  UniqueFd pidfd(watched ? static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)) : -1);
  UniqueFd lock_fd(::openat(dir_fd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW));
  struct stat st {};
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (!lock_fd || ::fstat(lock_fd.get(), &st) != 0 || ::fcntl(lock_fd.get(), F_OFD_SETLK, &fl) != 0) return;
  std::string dir = path_of_fd(dir_fd);
  std::string path = dir.empty() ? "" : fmt::format("{}/{}", dir, name);
  {
    std::lock_guard lk(mu_);
    // No pidfd of a watched creator: it is already gone; the reaper removes the file at once.
    held_.push_back({path, st.st_dev, st.st_ino, std::move(pidfd), std::move(lock_fd), watched});
  }
  if (!watched && !told_unseen_.exchange(true))
    fmt::print(stderr,
               "neffcachefs: {}: its creator runs outside this daemon's PID namespace, where the daemon cannot "
               "see whether it lives: such locks stay until they are removed, as on a disk (said once)\n",
               path);
  wake();
}

void ClientLocks::forget(int dir_fd, const char* name) {
  struct stat st {};
  if (::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  std::lock_guard lk(mu_);
  for (auto it = held_.begin(); it != held_.end(); ++it)
    if (it->dev == st.st_dev && it->ino == st.st_ino) {
      held_.erase(it);
      return;
    }
}

std::size_t ClientLocks::held() {
  std::lock_guard lk(mu_);
  return held_.size();
}

void ClientLocks::reap_loop() {
  while (!stop_) {
    std::vector<pollfd> fds{{wake_fd_.get(), POLLIN, 0}};
    {
      std::lock_guard lk(mu_);
      for (const auto& l : held_)
        if (l.watched) fds.push_back({l.pidfd.get(), POLLIN, 0});
    }
    ::poll(fds.data(), fds.size(), -1);
    uint64_t drained;
    (void)!::read(wake_fd_.get(), &drained, sizeof drained);
    std::vector<std::string> removed;
    std::unique_lock lk(mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      pollfd probe{it->pidfd.get(), POLLIN, 0};
      const bool exited = it->watched && (!it->pidfd || ::poll(&probe, 1, 0) == 1);
      if (!exited) {
        ++it;
        continue;
      }
      // The creator died holding its lock: remove the file if it is still that lock.
      struct stat st {};
      if (!it->path.empty() && ::lstat(it->path.c_str(), &st) == 0 && st.st_dev == it->dev && st.st_ino == it->ino) {
        ::unlink(it->path.c_str());
        fmt::print(stderr, "neffcachefs: removed {}: its creator exited without removing it\n", it->path);
        removed.push_back(it->path);
      }
      it = held_.erase(it);
    }
    lk.unlock();
    if (removed_)
      for (const auto& path : removed) removed_(path);
  }
}

}  // namespace neffcachefs
