// neffcachefs handlers: open files (open, create, read, write, flush, release, fsync).
#include "fs.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>

#include <fmt/format.h>

#include <neffcache/cache/layout.hpp>

#include "caller.hpp"

namespace neffcachefs {

using namespace neffcache;
using detail::UniqueFd;

Answer<fuse_file_info> Filesystem::open(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi) {
  Inode& i = inodes_.get(ino);
  fuse_file_info opened = fi;
  if (i.special != Inode::Special::none) {
    if (i.special == Inode::Special::stats_dir) return Errno{EISDIR};
    if ((fi.flags & O_ACCMODE) != O_RDONLY) return Errno{EACCES};
    // The counters as they were at the open (stats.hpp).
    opened.fh = stats_.open_snapshot(stats_json());
    set_open_caching(opened, NodeKind::special, true);
    return opened;
  }
  if (!i.placeholder) {
    const bool writes = opens_to_write(fi.flags);
    auto fail = [&](int e) -> Answer<fuse_file_info> {
      if (writes) passthrough_.not_answered(i);
      return Errno{e};
    };
    if (writes) {
      // Decided before the file is touched (a copy up, a truncation): passthrough.hpp.
      if (int e = passthrough_.writer_opening(i, opened)) return Errno{e};
      // A write of a file of a lower layer writes its copy in layer 0.
      if (int e = ns_.writable(i)) return fail(e);
    }
    int err = 0;
    PathRef pfd = inodes_.path_fd(i, err);
    if (!pfd) return fail(err);
    // Unlinked behind the daemon's back while the kernel still knows the name (a done
    // entry removed or repaired): the kernel looks the name up again.
    struct stat st {};
    if (::fstat(pfd->get(), &st) == 0 && st.st_nlink == 0 && !S_ISDIR(st.st_mode)) return fail(ESTALE);
    // A twin's name gets a file of its own before it is written (namespace.hpp).
    if (int e = writes ? ns_.own_content(i, st) : 0) return fail(e);
    int fd = ::open(proc_path(pfd->get()).c_str(), fi.flags & ~O_NOFOLLOW);
    if (fd < 0) return fail(errno);
    opened.fh = static_cast<uint64_t>(fd);
    if (writes) changing(ino, i, fi.flags);
    // A done entry's files: no FLUSH at a reader's close either (nothing to write back; a
    // client that locks one has its locks dropped at the release of its open instead).
    const bool reading = !writes;
    const NodeKind kind = Namespace::kind_of(i);
    if (reading) {
      passthrough_.reader_opening(caller, i, opened, kind == NodeKind::finished, inodes_.layer_of(i) != 0);
      if (backing_of(opened) > 0) stats_.read_bytes += static_cast<uint64_t>(st.st_size);
    }
    set_open_caching(opened, kind, reading, backing_of(opened) > 0);
    if (reading && i.done_neff) {
      ++stats_.hits;
      if (!i.index_offered.exchange(true)) {
        const std::string entry_dir = std::filesystem::path(path_of_fd(pfd->get())).parent_path().string();
        stats_.opened_entry(entry_dir);
        indexer_.seen(entry_dir);
      }
      opts_.store->remote().neff_opened(pfd->get());
    }
    return opened;
  }
  if (ClientLocks::is_lock_name(i.name.c_str())) return open_shown_lock(caller, i, fi);
  ++stats_.misses;
  if ((fi.flags & O_ACCMODE) != O_RDONLY) return Errno{EACCES};
  if (opts_.scratch) {
    // A read-only cache without an upper layer: nowhere to put a NEFF, and the scheduler
    // is never given a folder of a read-only layer (it would lock and publish there).
    ++stats_.refused;
    stats_.eio(EioSite::compile_refused, fmt::format("{}/{}: not compiled: {}", inodes_.path_of(*i.parent), i.name,
                                                     opts_.scheduler.settings.compiles_off));
    return Errno{EIO};
  }
  int err = 0;
  // An entry of a lower layer compiles in its copy in layer 0.
  PathRef dir = ns_.upper_dir(*i.parent, err);
  if (!dir) return Errno{err};
  return compile_.open(caller, ino, inodes_.id_of(i.parent), i.name, dir->get(), fi);
}

Answer<Filesystem::Created> Filesystem::create(const Caller& caller, fuse_ino_t parent, const char* name, mode_t mode,
                                               const fuse_file_info& fi) {
  Inode& p = inodes_.get(parent);
  if (p.placeholder || p.special != Inode::Special::none) return Errno{EACCES};
  int err = ns_.may_make(p, name, Namespace::Existing::opened);
  if (err) return Errno{err};
  PathRef dir = ns_.upper_dir(p, err);
  if (!dir) return Errno{err};
  bool existed = ::faccessat(dir->get(), name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
  // A client's lock: held elsewhere first. Another host's hold answers an exclusive create
  // as a disk answers one for a name created meanwhile; any other create succeeds, as on a
  // disk where the name exists, and its client compiles a second time (its NEFF never
  // replaces the other host's: store::Remote::publish_written).
  const auto held = !existed && ClientLocks::is_lock_name(name) ? hold_for_client(dir->get(), name).kind
                                                                 : ClientHold::here_only;
  if ((held == ClientHold::elsewhere || held == ClientHold::done) && (fi.flags & O_EXCL)) return Errno{EEXIST};
  // Never through a link: one planted in the backing directory between the kernel's
  // lookup and this create would make a root daemon create or truncate its target.
  int fd;  // handed to the kernel with the reply, so not a UniqueFd
  {
    CallersMode exact;
    fd = ::openat(dir->get(), name, fi.flags | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
  }
  if (fd < 0) return Errno{lock_not_made(held, dir->get(), name, errno)};
  ns_.made(dir->get(), name);
  // A lock file a client creates through the mount is owned by that client.
  if (!existed) {
    give_to_caller(caller, as_root_, dir->get(), fd);
    client_locks_.track(caller.pid, dir->get(), name);
  }
  Created c{{}, fi};
  UniqueFd pfd(::openat(dir->get(), name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
  if (!pfd || ::fstat(pfd.get(), &c.entry.attr) != 0) {
    const int err = errno;
    UniqueFd drop(fd);
    return Errno{err};
  }
  Inode* made = inodes_.intern(p, name, std::move(pfd), c.entry.attr);
  c.entry.ino = reinterpret_cast<fuse_ino_t>(made);
  c.entry.attr_timeout = c.entry.entry_timeout = cache_timeout(NodeKind::plain);
  // The kernel's from the reply on (lowlevel.cpp closes it if the reply fails).
  c.fi.fh = static_cast<uint64_t>(fd);
  // A writer: it bars passthrough readers of the file until it ends. (A create reaches an
  // existing file only through a name the kernel saw as absent; one that readers pass
  // through then is refused, but after its O_TRUNC, if it had one.)
  if (int e = passthrough_.writer_opening(*made, c.fi)) {
    UniqueFd drop(fd);
    forget(c.entry.ino, 1);
    return Errno{e};
  }
  changing(c.entry.ino, *made, fi.flags);
  return c;
}

void Filesystem::changing(fuse_ino_t ino, Inode& i, int flags) {
  // Not finished while it is written: readers take no pages kept from before, and a lookup
  // meanwhile keeps it so (namespace.cpp). (A truncation alone, by an open or a truncate,
  // the kernel makes itself, and drops its own pages for.)
  if ((flags & O_ACCMODE) != O_RDONLY) {
    ++i.writers;
    if (i.finished.exchange(false) || i.done_neff) notify_changed(session_, ino);
  }
  // Its entry's NEFF: the content index's record of the old bytes goes, and the next hit
  // offers the entry again.
  if (i.done_neff && opts_.scheduler.settings.content_index)
    if (const auto* index = opts_.store->content_index()) {
      index->forget(std::filesystem::path(inodes_.rel_path(i)).parent_path().string());
      i.index_offered = false;
    }
}

int Filesystem::lock_not_made(ClientHold::Kind held, int dir_fd, const char* name, int err) {
  // What was held for it is given back, as after the client's unlink.
  if (held == ClientHold::taken) act(inputs_.after_unlink(name), path_of_fd(dir_fd));
  return gone_or(err, dir_fd);
}

ClientHold Filesystem::hold_for_client(int dir_fd, const char* name) {
  return told(opts_.store->remote().hold_for_client(dir_fd, name), name);
}

ClientHold Filesystem::told(ClientHold held, std::string_view name) {
  if (held.kind == ClientHold::here_only && !held.why.empty() && !told_lock_here_only_.exchange(true))
    fmt::print(stderr,
               "neffcachefs: a client's lock {} holds on this host only: the bucket could not be asked ({}); "
               "other hosts may compile its entry too (said once)\n",
               name, held.why);
  return held;
}

Answer<struct flock> Filesystem::getlk(fuse_ino_t ino, const fuse_file_info& fi, const struct flock& lock) {
  if (is_special(ino)) return Errno{ENOLCK};
  return locks_.getlk(static_cast<int>(fi.fh), lock);
}

Answer<Ok> Filesystem::setlk(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi, const struct flock& lock,
                             bool sleep) {
  if (is_special(ino)) return Errno{ENOLCK};
  return locks_.setlk(caller, static_cast<int>(fi.fh), lock, sleep);
}

Answer<Ok> Filesystem::flock(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi, int op) {
  if (is_special(ino)) return Errno{ENOLCK};
  const int fd = static_cast<int>(fi.fh);
  Inode& i = inodes_.get(ino);
  std::optional<std::string> name;
  if (ino != FUSE_ROOT_ID && (op & LOCK_EX) && opts_.store->remote().publishes_writes()) {
    Inode* parent = inodes_.pin_parent(i);
    if (parent == &inodes_.root()) name = inodes_.name_of(i);
    inodes_.unpin(parent);
  }
  auto key = name ? lnl_lock_key(*name) : std::nullopt;
  // (An open that holds the key asks again: a no-op, as on a disk.)
  if (key) {
    std::lock_guard lk(key_holds_mu_);
    if (key_holds_.contains(fi.fh)) key.reset();
  }
  if (!key) {
    auto a = locks_.flock(caller, fd, op);
    if (op & LOCK_UN) let_go_of_key(fi.fh);
    return a;
  }
  // An LNL rank takes its key's lock to compile the key: the key's lease too, so that a
  // rank of another host waits in its flock until this one lets go, then finds the entry
  // done (docs/SEMANTICS.md).
  const std::string entry_dir = fmt::format("{}/{}", inodes_.path_of(inodes_.root()), *key);
  // Each open that asks notes itself first (key_holds_), and the lease the key has here
  // is given back when the last open that noted the key and did not get its lock is gone:
  // whichever open took the lease, some open that holds the lock, or none, is left with it.
  return locks_.flock_shared(
      caller, fd, op,
      [this, fh = fi.fh, entry_dir, lock = *name] {
        {
          std::lock_guard lk(key_holds_mu_);
          key_holds_[fh] = entry_dir;
        }
        const ClientHold held = told(opts_.store->remote().hold_key_for_client(entry_dir), lock);
        if (held.kind == ClientHold::elsewhere) {
          std::lock_guard lk(key_holds_mu_);
          key_holds_.erase(fh);
          return false;
        }
        // Fetched for the rank: the kernel forgets what it listed of the key before.
        if (held.kind == ClientHold::done) entry_changed(entry_dir);
        return true;
      },
      [this, fh = fi.fh, entry_dir](bool taken) {
        if (taken) return;
        {
          std::lock_guard lk(key_holds_mu_);
          key_holds_.erase(fh);
          for (const auto& [other, dir] : key_holds_)
            if (dir == entry_dir) return;  // an open that holds the key (or asks): it gives the lease back
        }
        opts_.store->remote().give_back_key(entry_dir);
      });
}

std::optional<std::string> Filesystem::take_key_hold(uint64_t fh) {
  std::lock_guard lk(key_holds_mu_);
  auto it = key_holds_.find(fh);
  if (it == key_holds_.end()) return std::nullopt;
  std::string entry_dir = std::move(it->second);
  key_holds_.erase(it);
  return entry_dir;
}

void Filesystem::let_go_of_key(uint64_t fh) {
  if (auto entry_dir = take_key_hold(fh)) act(InputAction::upload, *entry_dir);
}

Answer<fuse_file_info> Filesystem::open_shown_lock(const Caller& caller, Inode& i, const fuse_file_info& fi) {
  int err = 0;
  PathRef dir = ns_.upper_dir(*i.parent, err);
  if (!dir) return Errno{err};
  const char* name = i.name.c_str();
  fuse_file_info opened = fi;
  // A reader (cat, cp, tar) reads an empty file, and takes nothing.
  if (!opens_to_write(fi.flags)) {
    int fd = ::memfd_create("neffcache-shown-lock", MFD_CLOEXEC);
    if (fd < 0) return Errno{errno};
    opened.fh = static_cast<uint64_t>(fd);
    set_open_caching(opened, NodeKind::placeholder, true);
    return opened;
  }
  // (Taken for the client if the other host let go meanwhile.)
  const auto held = hold_for_client(dir->get(), name).kind;
  const bool existed = ::faccessat(dir->get(), name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
  int fd = ::openat(dir->get(), name, (fi.flags & ~O_NOFOLLOW) | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd < 0) return Errno{lock_not_made(held, dir->get(), name, errno)};
  ns_.made(dir->get(), name);
  if (!existed) {
    give_to_caller(caller, as_root_, dir->get(), fd);
    client_locks_.track(caller.pid, dir->get(), name);
  }
  opened.fh = static_cast<uint64_t>(fd);
  set_open_caching(opened, NodeKind::placeholder, false);
  return opened;
}

std::optional<std::string> Filesystem::read_special(fuse_ino_t ino, size_t size, off_t off, const fuse_file_info& fi) {
  if (is_stats_file(ino)) return stats_.read_snapshot(fi.fh, size, static_cast<std::size_t>(off));
  stats_.read_bytes += size;
  ++stats_.reads;
  return std::nullopt;
}

Answer<size_t> Filesystem::write(const char* data, size_t size, off_t off, const fuse_file_info& fi) {
  ssize_t n = ::pwrite(static_cast<int>(fi.fh), data, size, off);
  if (n < 0) return Errno{errno};
  return static_cast<size_t>(n);
}

int Filesystem::flush(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi) {
  if (is_special(ino)) return 0;
  // Every close() by the client: POSIX drops the closer's locks on the file. The kernel
  // keeps no record of locks it forwards, so they are dropped here.
  struct flock unlock {};
  unlock.l_type = F_UNLCK;
  unlock.l_whence = SEEK_SET;
  ::fcntl(static_cast<int>(fi.fh), F_OFD_SETLK, &unlock);
  // A client killed with an HLO open (release looks at written files only, and forgets
  // the mark of every file).
  if (inputs_.flush_may_cut(inodes_.name_of(inodes_.get(ino))) &&
      InputPolicy::killed_while_exiting(caller.pid))
    inputs_.mark_cut(fi.fh);
  // close() of a duplicate reports delayed write errors (NFS) without ending the open.
  int dup = ::dup(static_cast<int>(fi.fh));
  return dup >= 0 && ::close(dup) == 0 ? 0 : errno;
}

int Filesystem::release(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi) {
  if (is_stats_file(ino)) {
    stats_.release_snapshot(fi.fh);
    return 0;
  }
  passthrough_.ended(caller, inodes_.get(ino));
  const bool written = (fi.flags & O_ACCMODE) != O_RDONLY;
  if (written && !inodes_.get(ino).placeholder && --inodes_.get(ino).writers == 0) ns_.written(inodes_.get(ino));
  std::string path;
  if (inputs_.release_may_act(fi.fh, written, written && inodes_.get(ino).placeholder))
    path = inodes_.path_of(inodes_.get(ino));
  // (Its hold is taken before its descriptor is closed: another open may get its number.)
  const auto key_held = take_key_hold(fi.fh);
  UniqueFd(static_cast<int>(fi.fh)).reset();  // the open ends, and with it its flock
  if (key_held) act(InputAction::upload, *key_held);
  // A client finished writing an input into an entry: its compile or upload starts now,
  // in the background (input_policy.hpp).
  if (InputAction action = inputs_.after_close(path); action != InputAction::none)
    act(action, std::filesystem::path(path).parent_path().string());
  return 0;
}

void Filesystem::not_opened(fuse_ino_t ino, const fuse_file_info& fi) {
  // stats.json's handle is a snapshot number, not a descriptor (closing "descriptor" 3
  // would close one of ours).
  if (is_stats_file(ino)) return stats_.release_snapshot(fi.fh);
  UniqueFd(static_cast<int>(fi.fh)).reset();
  passthrough_.not_answered(inodes_.get(ino));
  if ((fi.flags & O_ACCMODE) != O_RDONLY && !inodes_.get(ino).placeholder && --inodes_.get(ino).writers == 0)
    ns_.written(inodes_.get(ino));
}

int Filesystem::fsync(fuse_ino_t ino, int datasync, const fuse_file_info& fi) {
  if (is_special(ino)) return 0;
  int fd = static_cast<int>(fi.fh);
  return (datasync ? ::fdatasync(fd) : ::fsync(fd)) == 0 ? 0 : errno;
}

int Filesystem::fallocate(fuse_ino_t ino, int mode, off_t off, off_t len, const fuse_file_info& fi) {
  if (is_special(ino)) return EOPNOTSUPP;
  return ::fallocate(static_cast<int>(fi.fh), mode, off, len) == 0 ? 0 : errno;
}

Answer<size_t> Filesystem::copy_file_range(fuse_ino_t in, off_t in_off, const fuse_file_info& in_fi, fuse_ino_t out,
                                           off_t out_off, const fuse_file_info& out_fi, size_t len, int flags) {
  if (is_special(in) || is_special(out)) return Errno{EOPNOTSUPP};
  loff_t from = in_off, to = out_off;
  ssize_t n = ::copy_file_range(static_cast<int>(in_fi.fh), &from, static_cast<int>(out_fi.fh), &to, len,
                                static_cast<unsigned>(flags));
  if (n < 0) return Errno{errno};
  return static_cast<size_t>(n);
}

Answer<off_t> Filesystem::lseek(fuse_ino_t ino, off_t off, int whence, const fuse_file_info& fi) {
  if (is_special(ino)) return Errno{EOPNOTSUPP};
  off_t at = ::lseek(static_cast<int>(fi.fh), off, whence);
  if (at < 0) return Errno{errno};
  return at;
}

}  // namespace neffcachefs
