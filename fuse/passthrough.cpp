// FUSE passthrough: the per-inode rule (passthrough.hpp).
#include "passthrough.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace neffcachefs {

std::string Passthrough::negotiate(fuse_conn_info* conn, bool wanted) {
  std::string why = decide(conn, wanted);
  negotiated_.store(true, std::memory_order_release);
  return why;
}

std::string Passthrough::decide(fuse_conn_info* conn, bool wanted) {
  on_ = false;
  if (!wanted) return why_off_ = "--no-passthrough";
  if (!k_libfuse_has_passthrough)
    return why_off_ = "this build's libfuse has none (3.16 or newer has it; see docs/INSTALL.md, libfuse)";
#ifdef FUSE_CAP_PASSTHROUGH
  if (!(conn->capable & FUSE_CAP_PASSTHROUGH))
    return why_off_ = "the kernel does not offer it (Linux 6.9 or newer, CONFIG_FUSE_PASSTHROUGH)";
  // The kernel lets only CAP_SYS_ADMIN register backing files.
  if (::geteuid() != 0) return why_off_ = "the daemon does not run as root";
  conn->want |= FUSE_CAP_PASSTHROUGH;
  // Backing files may be on a stacked file system (a container's overlayfs); nothing may
  // then be stacked on the mount itself.
  conn->max_backing_stack_depth = FUSE_BACKING_STACKED_OVER;
  on_ = true;
  why_off_.clear();
#else
  (void)conn;
#endif
  return why_off_;
}

std::string Passthrough::why_off() const {
  if (refused_) return "the kernel refused to register a backing file (EPERM: not CAP_SYS_ADMIN in the initial user namespace?)";
  return why_off_;
}

nlohmann::ordered_json Passthrough::stats() const {
  // (Asked by the metrics thread too, which may start before the kernel's INIT is answered.)
  if (!negotiated_.load(std::memory_order_acquire))
    return {{"on", false}, {"why_off", "not negotiated yet"}, {"opens", 0}, {"writers", 0}, {"fallbacks", 0}, {"busy", 0}};
  return {{"on", on()},
          {"why_off", on() ? nlohmann::ordered_json() : nlohmann::ordered_json(why_off())},
          {"opens", opens.load()},
          {"writers", writers.load()},
          {"fallbacks", fallbacks.load()},
          {"busy", busy.load()}};
}

int Passthrough::writer_opening(Inode& i, fuse_file_info& fi) {
  if (!on_) return 0;
  std::unique_lock lk(mu_);
  registered_.wait(lk, [&] { return !i.backing_registering; });  // (reader_opening)
  if (i.backing_opens > 0) {
    // The kernel takes only passthrough opens of this inode now, of its backing file: it
    // opens the writer's own from it, with the writer's flags. A lower layer's file
    // would be written behind its copy up (made by this write, or since the registration).
    if (i.backing_lower) return ETXTBSY;
    ++i.backing_opens;
    set_backing(fi, i.backing_id);
    ++opens;
    ++writers;
    return 0;
  }
  ++i.cached_opens;
  return 0;
}

void Passthrough::reader_opening(const Caller& caller, Inode& i, fuse_file_info& fi, bool eligible, bool lower) {
  if (!on_) return;
  close_pending(caller);
  std::unique_lock lk(mu_);
  // An open of the same inode registering its backing file: every open after it takes
  // what it ends with (passes through with its backing file, or is cached).
  registered_.wait(lk, [&] { return !i.backing_registering; });
  if (i.backing_opens > 0) {  // every open of it must pass through now
    ++i.backing_opens;
    set_backing(fi, i.backing_id);
    ++opens;
    return;
  }
  if (eligible && i.cached_opens == 0 && !refused_) {
    // The ioctl waits for no request, but is made without mu_ held: only the opens of
    // this inode wait for it.
    i.backing_registering = true;
    lk.unlock();
    errno = 0;
    const int id = caller.open_backing(static_cast<int>(fi.fh));
    const int err = errno;
    lk.lock();
    i.backing_registering = false;
    registered_.notify_all();
    if (id > 0) {
      i.backing_id = id;
      i.backing_lower = lower;
      i.backing_opens = 1;
      set_backing(fi, id);
      ++opens;
      return;
    }
    if (err == EPERM) refused_ = true;
    ++fallbacks;
  } else if (eligible) {
    ++busy;
  }
  ++i.cached_opens;
}

int Passthrough::end_locked(Inode& i) {
  // The two never coexist: a passthrough open starts only without cached ones, and while
  // one lasts every open passes through.
  if (i.backing_opens > 0) {
    if (--i.backing_opens == 0) return std::exchange(i.backing_id, 0);
  } else if (i.cached_opens > 0) {
    --i.cached_opens;
  }
  return 0;
}

void Passthrough::close_pending(const Caller& caller) {
  std::vector<int> ids;
  {
    std::lock_guard lk(mu_);
    ids.swap(to_close_);
  }
  for (int id : ids) caller.close_backing(id);
}

void Passthrough::ended(const Caller& caller, Inode& i) {
  if (!on_) return;
  close_pending(caller);
  int id = 0;
  {
    std::lock_guard lk(mu_);
    id = end_locked(i);
  }
  // (Closed without mu_: a reader that registers the inode again meanwhile gets an id of
  // its own.)
  if (id) caller.close_backing(id);
}

void Passthrough::not_answered(Inode& i) {
  if (!on_) return;
  std::lock_guard lk(mu_);
  if (int id = end_locked(i)) to_close_.push_back(id);
}

}  // namespace neffcachefs
