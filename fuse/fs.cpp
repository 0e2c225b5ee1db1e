// neffcachefs handlers: lifecycle, names and attributes. Design notes:
// - Lookups never follow symlinks and take one name at a time, so nothing outside the
//   backing directory is reachable through the mount.
// - In a pending entry, model.neff and model.done are placeholders (entry_view.hpp):
//   found by a lookup (never listed), stat-able (size 0, no caching), and opening one
//   submits the entry's compile and keeps the request; the reply comes from the
//   scheduler's callback, so no handler thread waits (compile_on_open.hpp).
// - Kernel notifications are sent only from scheduler or preparer threads, never from
//   inside a handler (libfuse documents that as a deadlock).
#include "fs.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

namespace neffcachefs {

// What the kernel may read ahead of a reader through the page cache (INIT, and the mount's
// own setting: Filesystem::mounted).
constexpr unsigned k_readahead = 1 << 20;

using namespace neffcache;
using detail::UniqueFd;


Filesystem::Filesystem(Options opts)
    : opts_(std::move(opts)),
      ns_(opts_),
      inputs_(opts_.eager, opts_.store->remote().publishes_writes()),
      compile_(opts_, stats_),
      client_locks_([this](const std::string& path) {
        const std::filesystem::path p(path);
        act(inputs_.after_unlink(p.filename().string()), p.parent_path().string());
      }),
      indexer_(opts_.scratch ? std::string() : opts_.backing,
               opts_.scheduler.settings.content_index ? opts_.store->content_index() : nullptr, opts_.default_flags,
               opts_.index_scan) {
  opts_.scheduler.settings.retry_failed = opts_.retry_failed;
  opts_.scheduler.settings.default_flags = opts_.default_flags;
  // Our publish, interrupted after its NEFF went in place: finished by a job as any compile
  // (compile_entry checks the NEFF's bytes under the entry's lock, then writes the marker).
  ns_.when_unfinished([this](const std::string& entry_dir) { compile_.request(entry_dir, Priority::background, nullptr); });
  compile_.when_ended([this](const std::string& entry_dir) { entry_changed(entry_dir); });
}

void Filesystem::entry_changed(const std::string& entry_dir) {
  auto tell = [&](const std::string& dir) {
    struct stat st {};
    if (::stat(dir.c_str(), &st) == 0)
      if (auto id = inodes_.known(st)) notify_changed(session_, *id);
  };
  tell(entry_dir);
  if (EntryFiles::of_entry_path(entry_dir).is_lnl()) tell(std::filesystem::path(entry_dir).parent_path().string());
}

void Filesystem::start() {
  compile_.start();
  client_locks_.start();
  indexer_.start();
}

Filesystem::~Filesystem() { shutdown(); }

void Filesystem::shutdown() {
  if (stopped_.exchange(true)) return;
  compile_.shutdown();
  indexer_.stop();
  // Lock waits end with EINTR while the session can still carry the replies.
  locks_.stop();
  // Clients that are still alive keep their lock files; only our holds end.
  client_locks_.stop();
}

nlohmann::ordered_json Filesystem::stats_document(bool with_opened) const {
  Stats::Context ctx{compile_.progress(), opts_.scheduler.jobs, opts_.mountpoint, opts_.backing, opts_.lowers,
                     opts_.scratch, std::nullopt, indexer_.stats(), {}, passthrough_.stats()};
  const auto& p = ctx.progress;
  // Budget and what is held host-wide: null when compiles are admitted by count only.
  ctx.memory = {{"budget", nullptr}, {"reserved", p.memory_reserved}, {"host_reserved", nullptr},
                {"waiting", p.waiting_for_memory}, {"oom_kills", p.oom_kills}};
  if (const auto& ledger = opts_.scheduler.memory) {
    uint64_t host = 0;
    for (const auto& h : ledger->holders()) host += h.reserved;
    ctx.memory["budget"] = ledger->budget();
    ctx.memory["host_reserved"] = host;
    ctx.memory["ledger"] = ledger->dir();
  }
  if (auto counters = opts_.store->remote().counters()) {
    ctx.s3 = std::move(counters);
    (*ctx.s3)["url"] = opts_.store->name();
  }
  return stats_.document(ctx, with_opened);
}

void Filesystem::act(InputAction action, const std::string& entry_dir) {
  if (action == InputAction::none) return;
  compile_.request(entry_dir, Priority::background, nullptr, /*upload_only=*/action == InputAction::upload);
}

fuse_entry_param Filesystem::entry_of(const Node& n) const {
  fuse_entry_param e{};
  e.ino = inodes_.id_of(n.inode);
  if (n.kind == NodeKind::special) getattr_of(*n.inode, e.attr);
  else e.attr = n.attr;
  e.attr_timeout = e.entry_timeout = cache_timeout(n.kind);
  return e;
}

Answer<fuse_entry_param> Filesystem::lookup_entry(Inode& parent, const char* name) {
  auto node = ns_.lookup(parent, name);
  if (!node.ok()) return Errno{node.error()};
  return entry_of(node.value());
}

void Filesystem::init(fuse_conn_info* conn) {
  // Capability negotiation, in one place.
  if (conn->capable & FUSE_CAP_SPLICE_READ) conn->want |= FUSE_CAP_SPLICE_READ;
  if (conn->capable & FUSE_CAP_SPLICE_WRITE) conn->want |= FUSE_CAP_SPLICE_WRITE;
  if (conn->capable & FUSE_CAP_SPLICE_MOVE) conn->want |= FUSE_CAP_SPLICE_MOVE;
  // readdirplus answers `ls -l` without a lookup per name; the kernel asks for it only
  // when lookups follow a listing (adaptive), so a plain walk stays cheap.
  if (conn->capable & FUSE_CAP_READDIRPLUS) conn->want |= FUSE_CAP_READDIRPLUS;
  if (conn->capable & FUSE_CAP_READDIRPLUS_AUTO) conn->want |= FUSE_CAP_READDIRPLUS_AUTO;
  // Locks are forwarded to the backing files (lock_forwarding.hpp).
  if (conn->capable & FUSE_CAP_POSIX_LOCKS) conn->want |= FUSE_CAP_POSIX_LOCKS;
  if (conn->capable & FUSE_CAP_FLOCK_LOCKS) conn->want |= FUSE_CAP_FLOCK_LOCKS;
  // Cached pages and listings are checked against mtime whenever attributes are fetched.
  if (conn->capable & FUSE_CAP_AUTO_INVAL_DATA) conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
  // A merged folder's listing changes with folders of other layers, whose mtimes the
  // kernel does not see: over layers, folders are opened and listed every time.
  no_opendir_ = !ns_.layered() && (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT);
  if (no_opendir_) conn->want |= FUSE_CAP_NO_OPENDIR_SUPPORT;
  conn->want &= ~FUSE_CAP_EXPORT_SUPPORT;  // no ".." lookups from NFS re-export
  // A write or truncate by someone who may not keep a file's set-user-ID and
  // set-group-ID bits clears them. The kernel knows who that is (the daemon writes as
  // itself, and as root it would keep them): it does it, with a change of mode.
  conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
  // Done files read by the kernel itself (passthrough.hpp); said once either way.
  if (auto why = passthrough_.negotiate(conn, opts_.passthrough); why.empty())
    fmt::print(stderr, "neffcachefs: FUSE passthrough on: the kernel reads done files without the daemon\n");
  else
    fmt::print(stderr, "neffcachefs: FUSE passthrough off: {}\n", why);
  conn->max_write = 1 << 20;
  conn->max_readahead = k_readahead;
  // Parallel readers of many NEFFs: the kernel default of 12 throttles them.
  conn->max_background = 64;
  conn->congestion_threshold = 48;
}

void Filesystem::mounted(const std::string& mountpoint) {
  // The mount's device, from the mount table: a stat of the mount point would wait for
  // INIT, which no thread answers yet.
  std::ifstream table("/proc/self/mountinfo");
  // (Its folder made canonical, not the mount point itself, which would wait for INIT too.)
  const std::filesystem::path point(mountpoint);
  std::error_code ec;
  const std::string at = (std::filesystem::weakly_canonical(point.parent_path(), ec) / point.filename()).string();
  std::string dev;
  for (std::string line; std::getline(table, line);) {
    std::istringstream fields(line);
    std::string id, parent, device, root, point;
    if (fields >> id >> parent >> device >> root >> point && point == at) dev = device;  // the last: on top
  }
  if (dev.empty()) return;
  std::ofstream("/sys/class/bdi/" + dev + "/read_ahead_kb") << (k_readahead >> 10);
}

Answer<fuse_entry_param> Filesystem::lookup(fuse_ino_t parent, const char* name) {
  return lookup_entry(inodes_.get(parent), name);
}

void Filesystem::getattr_of(const Inode& i, struct stat& st) const {
  st = {};
  st.st_ino = static_cast<ino_t>(reinterpret_cast<uintptr_t>(&i) & 0x7fffffffffffULL);
  st.st_nlink = 1;
  st.st_mtime = st.st_ctime = st.st_atime = ::time(nullptr);
  if (i.special == Inode::Special::stats_dir) {
    st.st_mode = S_IFDIR | 0555;
    st.st_nlink = 2;
  } else {
    st.st_mode = S_IFREG | 0444;
    st.st_size = static_cast<off_t>(stats_json().size());
  }
}

Answer<Filesystem::Attr> Filesystem::getattr(fuse_ino_t ino, fuse_file_info* fi) {
  Inode& i = inodes_.get(ino);
  Attr a{{}, cache_timeout(Namespace::kind_of(i))};
  struct stat& st = a.st;
  if (i.special != Inode::Special::none) {
    getattr_of(i, st);
    return a;
  }
  if (i.placeholder && fi && ClientLocks::is_lock_name(i.name.c_str())) {
    // A shown lock opened (open_shown_lock): the file that open made or gave.
    if (::fstat(static_cast<int>(fi->fh), &st) != 0) return Errno{errno};
    st.st_ino = static_cast<ino_t>(ino & 0x7fffffffffffULL);
  } else if (i.placeholder) {
    // Once produced, the real file's attributes: fstat after open shows the true size.
    // Before, those the product will have (entry_view.hpp).
    int err = 0;
    PathRef dir = inodes_.path_fd(*i.parent, err);
    if (!dir || ::fstatat(dir->get(), i.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      auto attr = dir ? ns_.placeholder_attr(*i.parent, dir->get(), i.name) : std::nullopt;
      if (!attr) return Errno{ENOENT};  // neither the product nor a placeholder any longer
      st = *attr;
    }
    st.st_ino = static_cast<ino_t>(ino & 0x7fffffffffffULL);
  } else if (fi) {  // an open file: its own descriptor, even unlinked (kept briefly)
    if (::fstat(static_cast<int>(fi->fh), &st) != 0) return Errno{errno};
    a.timeout = cache_timeout(NodeKind::plain);
  } else {
    int err = 0;
    PathRef fd = inodes_.path_fd(i, err);
    if (!fd) return Errno{err};
    if (::fstatat(fd->get(), "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return Errno{errno};
  }
  return a;
}

Answer<Filesystem::Attr> Filesystem::setattr(fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  Inode& i = inodes_.get(ino);
  // The truncation that follows an open(O_TRUNC) of another host's lock shown here, which
  // the open made for real (open_shown_lock): on its descriptor.
  if (i.placeholder && fi && ClientLocks::is_lock_name(i.name.c_str())) {
    if ((to_set & FUSE_SET_ATTR_SIZE) && ::ftruncate(static_cast<int>(fi->fh), attr->st_size) != 0)
      return Errno{errno};
    return getattr(ino, fi);
  }
  if (i.placeholder || i.special != Inode::Special::none) return Errno{EACCES};
  if (int e = ns_.writable(i)) return Errno{e};
  int err = 0;
  PathRef fd = inodes_.path_fd(i, err);
  if (!fd) return Errno{err};
  std::string path = proc_path(fd->get());
  struct stat own {};
  const bool known = (fi || (to_set & FUSE_SET_ATTR_SIZE)) && ::fstat(fd->get(), &own) == 0;
  // A directory's handle is ours, not a descriptor: it is changed by path.
  if (fi && (!known || !S_ISREG(own.st_mode))) fi = nullptr;
  // A truncate by name changes the bytes: a twin's name gets a file of its own first. (A
  // descriptor's open, which wrote, split it already.)
  if (int e = known && (to_set & FUSE_SET_ATTR_SIZE) && !fi ? ns_.own_content(i, own) : 0) return Errno{e};
  int rc = 0;
  if (to_set & FUSE_SET_ATTR_MODE) rc = fi ? ::fchmod(static_cast<int>(fi->fh), attr->st_mode) : ::chmod(path.c_str(), attr->st_mode);
  if (rc == 0 && (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
    uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : static_cast<uid_t>(-1);
    gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : static_cast<gid_t>(-1);
    rc = ::fchownat(fd->get(), "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
  }
  if (rc == 0 && (to_set & FUSE_SET_ATTR_SIZE)) {
    rc = fi ? ::ftruncate(static_cast<int>(fi->fh), attr->st_size) : ::truncate(path.c_str(), attr->st_size);
    if (rc == 0) changing(ino, i, O_RDONLY);
  }
  if (rc == 0 && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
    struct timespec tv[2];
    tv[0].tv_nsec = tv[1].tv_nsec = UTIME_OMIT;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) tv[0].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_ATIME) tv[0] = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) tv[1].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_MTIME) tv[1] = attr->st_mtim;
    rc = fi ? ::futimens(static_cast<int>(fi->fh), tv) : ::utimensat(AT_FDCWD, path.c_str(), tv, 0);
  }
  if (rc != 0) return Errno{errno};
  return getattr(ino, fi);
}

Answer<std::string> Filesystem::readlink(fuse_ino_t ino) {
  Inode& i = inodes_.get(ino);
  if (i.placeholder || i.special != Inode::Special::none) return Errno{EINVAL};
  int err = 0;
  PathRef fd = inodes_.path_fd(i, err);
  if (!fd) return Errno{err};
  char buf[PATH_MAX + 1];
  ssize_t n = ::readlinkat(fd->get(), "", buf, sizeof buf - 1);
  if (n < 0) return Errno{errno};
  return std::string(buf, static_cast<std::size_t>(n));
}

Answer<struct statvfs> Filesystem::statfs(fuse_ino_t ino) {
  struct statvfs st {};
  int err = 0;
  PathRef fd = inodes_.path_fd(inodes_.get(ino), err);
  if (::fstatvfs(fd ? fd->get() : inodes_.root_fd()->get(), &st) != 0) return Errno{errno};
  return st;
}

Answer<Filesystem::Xattr> Filesystem::getxattr(fuse_ino_t ino, const char* name, size_t size) {
  int err = 0;
  PathRef fd = inodes_.path_fd(inodes_.get(ino), err);
  if (!fd) return Errno{err == ENOENT ? ENODATA : err};
  Xattr x;
  x.bytes.resize(size);
  ssize_t n = ::getxattr(proc_path(fd->get()).c_str(), name, size ? x.bytes.data() : nullptr, size);
  if (n < 0) return Errno{errno};
  x.size_only = size == 0;
  x.size = static_cast<size_t>(n);
  x.bytes.resize(x.size_only ? 0 : x.size);
  return x;
}

Answer<Filesystem::Xattr> Filesystem::listxattr(fuse_ino_t ino, size_t size) {
  int err = 0;
  PathRef fd = inodes_.path_fd(inodes_.get(ino), err);
  if (!fd && err != ENOENT) return Errno{err};
  Xattr x;
  x.size_only = size == 0;
  if (!fd) return x;  // nothing: an empty list
  x.bytes.resize(size);
  ssize_t n = ::listxattr(proc_path(fd->get()).c_str(), size ? x.bytes.data() : nullptr, size);
  if (n < 0) return Errno{errno};
  x.size = static_cast<size_t>(n);
  x.bytes.resize(x.size_only ? 0 : x.size);
  return x;
}

int Filesystem::setxattr(fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  if (int e = inodes_.get(ino).placeholder ? 0 : ns_.writable(inodes_.get(ino))) return e;
  int err = 0;
  PathRef fd = inodes_.path_fd(inodes_.get(ino), err);
  if (!fd) return err == ENOENT ? EACCES : err;
  return ::setxattr(proc_path(fd->get()).c_str(), name, value, size, flags) == 0 ? 0 : errno;
}

int Filesystem::removexattr(fuse_ino_t ino, const char* name) {
  if (int e = inodes_.get(ino).placeholder ? 0 : ns_.writable(inodes_.get(ino))) return e;
  int err = 0;
  PathRef fd = inodes_.path_fd(inodes_.get(ino), err);
  if (!fd) return err == ENOENT ? ENODATA : err;
  return ::removexattr(proc_path(fd->get()).c_str(), name) == 0 ? 0 : errno;
}

}  // namespace neffcachefs
