// The caller's umask and ownership (caller.hpp).
#include "caller.hpp"

#include <fcntl.h>
#include <sched.h>
#include <sys/stat.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include "inode_table.hpp"

namespace neffcachefs {

CallersMode::CallersMode() {
  if (own_umask()) old_ = ::umask(0);
}

CallersMode::~CallersMode() {
  if (old_) ::umask(*old_);
}

bool CallersMode::own_umask() {
  thread_local const bool own = [] {
    if (::unshare(CLONE_FS) == 0) return true;
    static std::atomic<bool> told{false};
    if (!told.exchange(true))
      fmt::print(stderr, "neffcachefs: warning: a request thread cannot take a umask of its own ({}); "
                         "files created through the mount get the daemon's umask as well\n", std::strerror(errno));
    return false;
  }();
  return own;
}

void give_to_caller(const Caller& caller, bool as_root, int dir_fd, int fd) {
  if (!as_root) return;  // then the caller is us
  struct stat parent {}, st {};
  if (::fstat(fd, &st) != 0) return;
  // In a set-group-ID folder the file keeps the folder's group, as on a local disk.
  const bool inherit_group = ::fstat(dir_fd, &parent) == 0 && (parent.st_mode & S_ISGID);
  const gid_t gid = inherit_group ? st.st_gid : caller.gid;
  if (st.st_uid == caller.uid && st.st_gid == gid) return;  // a root caller's own
  if (::fchownat(fd, "", caller.uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return;
  // A change of owner clears a file's set-user-ID and set-group-ID bits; the caller asked
  // for them, and a local disk keeps them for the file's owner, set-group-ID only when the
  // owner is in the file's group.
  mode_t keep = st.st_mode & (S_ISUID | S_ISGID);
  if (S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode) || keep == 0) return;
  if ((keep & S_ISGID) && !caller.in_group(gid)) keep &= ~S_ISGID;
  if (keep != 0) (void)!::chmod(proc_path(fd).c_str(), st.st_mode & 07777 & ~((S_ISUID | S_ISGID) & ~keep));
}

}  // namespace neffcachefs
