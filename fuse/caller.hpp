// The caller of a request that creates something: its umask, and ownership of what the
// daemon creates for it.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/types.h>

#include <optional>

namespace neffcachefs {

// The mode of a create, mkdir or mknod arrives with the caller's umask already applied
// by the kernel, so the daemon must apply none of its own to it. A umask belongs to the
// fs_struct that a process's threads share, so a request thread takes one of its own
// (once), and sets its umask to 0 only for the scope of a client's create: whatever else
// the daemon creates (tier folders, published NEFFs) gets the daemon's umask.
class CallersMode {
 public:
  CallersMode();
  ~CallersMode();
  CallersMode(const CallersMode&) = delete;
  CallersMode& operator=(const CallersMode&) = delete;

 private:
  static bool own_umask();
  std::optional<mode_t> old_;
};

// A daemon running as root gives what it creates for a caller to that caller: their
// files stay theirs, and the NEFFs compiled from their HLOs are theirs too. `fd` is the
// new file's (any kind of descriptor, O_PATH included), in the folder `dir_fd`. Does
// nothing unless `as_root`.
void give_to_caller(fuse_req_t req, bool as_root, int dir_fd, int fd);

}  // namespace neffcachefs
