// neffcachefs handlers: making, removing, renaming and listing names.
#include "fs.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include <neffcache/cache/layout.hpp>

#include "caller.hpp"

namespace neffcachefs {

using namespace neffcache;
using detail::UniqueFd;

Answer<fuse_entry_param> Filesystem::mknod_like(const Caller& caller, fuse_ino_t parent, const char* name,
                                                mode_t mode, const char* target) {
  Inode& p = inodes_.get(parent);
  if (p.placeholder || p.special != Inode::Special::none) return Errno{p.placeholder ? ENOTDIR : EACCES};
  // Device nodes are refused: a compile cache has no use for them, the mount is nodev,
  // and the backing directory may not be (a root daemon would make them for the caller).
  if (S_ISCHR(mode) || S_ISBLK(mode)) return Errno{EPERM};
  int err = ns_.may_make(p, name);
  if (err) return Errno{err};
  PathRef dir = ns_.upper_dir(p, err);
  if (!dir) return Errno{err};
  // A folder made over a whiteout is made whole under a private name, then put in place.
  const bool opaque = S_ISDIR(mode) && ns_.new_folder_opaque(p, dir->get(), name);
  int rc;
  {
    CallersMode exact;
    rc = target ? ::symlinkat(target, dir->get(), name)
         : opaque ? Namespace::make_opaque_dir(dir->get(), name, mode)
         : S_ISDIR(mode) ? ::mkdirat(dir->get(), name, mode)
                         : ::mknodat(dir->get(), name, mode, 0);
  }
  if (rc != 0) return Errno{gone_or(errno, dir->get())};
  ns_.made(dir->get(), name);
  if (as_root_) {
    UniqueFd made(::openat(dir->get(), name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (made) give_to_caller(caller, as_root_, dir->get(), made.get());
  }
  return lookup_entry(p, name);
}

int Filesystem::unlink(fuse_ino_t parent, const char* name, bool dir) {
  Inode& p = inodes_.get(parent);
  if (p.placeholder || p.special != Inode::Special::none) return p.placeholder ? ENOTDIR : EACCES;
  const int rc = ns_.remove(p, name, dir, [&](int dir_fd) { client_locks_.forget(dir_fd, name); });
  if (rc == 0 && !dir)
    if (const InputAction action = inputs_.after_unlink(name); action != InputAction::none)
      act(action, inodes_.path_of(p));
  // A placeholder has no file behind it: its unlink succeeds and removes nothing, as a
  // client that has just seen the name expects (an LNL rank clears a dead holder's marker
  // this way). The name shows again for as long as the entry stays pending (entry_view.hpp).
  if (rc == ENOENT && !dir && ns_.is_placeholder(p, name)) return 0;
  return rc;
}

int Filesystem::rename(fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname, unsigned flags) {
  Inode& p = inodes_.get(parent);
  Inode& np = inodes_.get(newparent);
  PathRef pfd, npfd;
  if (int e = ns_.prepare_rename(p, name, np, newname, flags, pfd, npfd)) return e;
  if (&np == &inodes_.root() && is_lnl_key(newname) && !(flags & RENAME_EXCHANGE))
    if (int e = promote(pfd->get(), name, npfd->get(), newname, flags); e != 0) return e;
  if (::syscall(SYS_renameat2, pfd->get(), name, npfd->get(), newname, flags) != 0) return errno;
  ns_.made(npfd->get(), newname);
  // The kernel keeps the moved inodes under their new names: so does this process.
  inodes_.moved(np, npfd->get(), newname);
  if (flags & RENAME_EXCHANGE) inodes_.moved(p, pfd->get(), name);
  // An HLO renamed into place is a finished write (input_policy.hpp).
  if (InputAction action = inputs_.after_rename(newname); action != InputAction::none)
    act(action, inodes_.path_of(np));
  return 0;
}

// Whether the folder `name` in `dir` holds no names.
static bool is_empty_dir(int dir, const char* name) {
  int fd = ::openat(dir, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return false;
  bool empty = true;
  (void)detail::list_dir(fd, name, [&](std::string_view, bool) { empty = false; });  // (takes fd)
  return empty;
}

// A folder renamed to an LNL key in the root: LNL's save_cache() publishing an entry to
// its remote cache. The store's remote publishes it first (the tier's: to S3, only if no
// host has the entry yet; a plain folder's does nothing); a taken key fails as a rename
// onto a non-empty folder does on a local disk, and nothing is renamed. Only what the
// local rename would allow is tried: a folder (not an entry already), onto a name that is
// free or an empty folder.
int Filesystem::promote(int from_dir, const char* name, int to_dir, const char* newname, unsigned flags) {
  struct stat src {}, dst {};
  if (::fstatat(from_dir, name, &src, AT_SYMLINK_NOFOLLOW) != 0) return errno;
  if (!S_ISDIR(src.st_mode)) return 0;
  if (::fstatat(to_dir, newname, &dst, AT_SYMLINK_NOFOLLOW) == 0) {
    if (flags & RENAME_NOREPLACE) return EEXIST;
    if (!S_ISDIR(dst.st_mode)) return ENOTDIR;
    if (dst.st_nlink > 2 || !is_empty_dir(to_dir, newname)) return ENOTEMPTY;
  }
  const std::string folder = fmt::format("{}/{}", path_of_fd(from_dir), name);
  auto published = opts_.store->remote().promote(folder, fmt::format("{}/{}", path_of_fd(to_dir), newname));
  if (published) return 0;
  if (published.error().code == Errc::exists) {
    fmt::print(stderr, "neffcachefs: {} not published as {}: {}\n", folder, newname, published.error().message);
    return ENOTEMPTY;
  }
  stats_.eio(EioSite::promote_failed, fmt::format("{} not published as {}: {}", folder, newname,
                                                  published.error().message));
  return EIO;
}

Answer<fuse_entry_param> Filesystem::link(fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Inode& i = inodes_.get(ino);
  Inode& np = inodes_.get(newparent);
  int err = ns_.may_link(i, np, newname);
  if (err) return Errno{err};
  PathRef fd = inodes_.path_fd(i, err), npfd = fd ? ns_.upper_dir(np, err) : nullptr;
  if (!fd || !npfd) return Errno{i.placeholder || i.special != Inode::Special::none ? EPERM : err};
  if (::linkat(AT_FDCWD, proc_path(fd->get()).c_str(), npfd->get(), newname, AT_SYMLINK_FOLLOW) != 0) return Errno{errno};
  ns_.made(npfd->get(), newname);
  return lookup_entry(np, newname);
}

// Folders are opened by the kernel alone when it can (no OPENDIR/RELEASEDIR requests:
// two round trips per folder of a walk). A listing is read at offset 0 and kept until
// its end is read; the kernel caches it and drops it when the folder's mtime changes,
// which every change of an entry's state does.
Answer<fuse_file_info> Filesystem::opendir(fuse_ino_t ino, const fuse_file_info& fi) {
  if (no_opendir_) return Errno{ENOSYS};
  if (inodes_.get(ino).placeholder) return Errno{ENOTDIR};
  fuse_file_info opened = fi;
  opened.fh = 0;
  set_listing_caching(opened, ns_.layered());  // (over layers, listings change unseen)
  return opened;
}

int Filesystem::readdir(fuse_ino_t ino, off_t off, bool plus, const AddEntry& add) {
  Inode& dir = inodes_.get(ino);
  if (dir.placeholder) return ENOTDIR;
  int err = 0;
  std::shared_ptr<const Listing> h = ns_.listing(dir, off, err);
  if (!h) return err;
  bool any = false;
  for (auto i = static_cast<std::size_t>(off); i < h->size(); ++i) {
    const auto& ent = (*h)[i];
    fuse_entry_param e{};
    // With plus, each name is looked up as the kernel would (one more reference to its
    // inode). Inode 0 means "no attributes, look it up yourself": for . and .., names
    // that went away meanwhile, and the mount-only folder.
    bool looked_up = false;
    if (plus && dir.special == Inode::Special::none && ent.name != "." && ent.name != "..") {
      auto found = lookup_entry(dir, ent.name.c_str());
      if ((looked_up = found.ok())) e = found.value();
    }
    if (!looked_up) {
      e = {};
      e.attr.st_ino = ent.ino ? ent.ino : 1;
      e.attr.st_mode = static_cast<mode_t>(ent.type) << 12;
    }
    if (!add(ent.name, e, static_cast<off_t>(i + 1), plus)) {
      if (looked_up) forget(e.ino, 1);  // not sent: the kernel never learns of it
      break;
    }
    any = true;
  }
  if (!any) ns_.done_listing(dir, h);  // the end: let the listing go
  return 0;
}

}  // namespace neffcachefs
