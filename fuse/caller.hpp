// The caller of a request, as the handlers see it: who it is, and a way to keep its
// request for a later answer. lowlevel.cpp makes one of each request; tests make their
// own, so the handlers run without a mount. Also: the caller's umask, and ownership of
// what the daemon creates for it.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/types.h>

#include <memory>
#include <optional>

#include "reply.hpp"

namespace neffcachefs {

class Caller {
 public:
  Caller(uid_t u, gid_t g, pid_t p) : uid(u), gid(g), pid(p) {}
  virtual ~Caller() = default;
  uid_t uid;
  gid_t gid;
  pid_t pid;
  // Whether the caller is in group `g`: its own or a supplementary one.
  virtual bool in_group(gid_t g) const = 0;
  // Keeps the request: the handler answers Deferred, and later through what this returns.
  virtual std::unique_ptr<Later> keep() const = 0;
  // FUSE passthrough (passthrough.hpp): registers `fd` with the kernel as a backing file;
  // its id, or 0 when it cannot be. close_backing gives an id back.
  virtual int open_backing(int fd) const {
    (void)fd;
    return 0;
  }
  virtual void close_backing(int id) const { (void)id; }
};

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
void give_to_caller(const Caller& caller, bool as_root, int dir_fd, int fd);

}  // namespace neffcachefs
