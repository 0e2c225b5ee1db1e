// neffcachefs handlers: making, removing, renaming and listing names.
#include "fs.hpp"

#include <dirent.h>
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

Answer<fuse_entry_param> Filesystem::mknod_like(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode,
                                                const char* target) {
  Inode& p = inodes_.get(parent);
  if (p.placeholder || p.special != Inode::Special::none) return Errno{p.placeholder ? ENOTDIR : EACCES};
  // Device nodes are refused: a compile cache has no use for them, the mount is nodev,
  // and the backing directory may not be (a root daemon would make them for the caller).
  if (S_ISCHR(mode) || S_ISBLK(mode)) return Errno{EPERM};
  int err = 0;
  if (layered()) {
    if ((err = may_make(name)) != 0) return Errno{err};
    Found found;
    if (find(p, name, found) == 0) return Errno{EEXIST};
  }
  PathRef dir = upper_dir(p, err);
  if (!dir) return Errno{err};
  // A folder made over a whiteout is opaque: what the layers below had under that name
  // stays hidden (layers.hpp). It is made whole under a private name, then put in place.
  // (An entry folder is taken whole from one layer anyway.)
  const bool opaque = layered() && S_ISDIR(mode) &&
                      ::faccessat(dir->get(), whiteout_of(name).c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0 &&
                      !is_whole_folder(rel_of(p, name));
  int rc;
  {
    CallersMode exact;
    rc = target ? ::symlinkat(target, dir->get(), name)
         : opaque ? make_opaque_dir(dir->get(), name, mode)
         : S_ISDIR(mode) ? ::mkdirat(dir->get(), name, mode)
                         : ::mknodat(dir->get(), name, mode, 0);
  }
  if (rc != 0) return Errno{gone_or(errno, dir->get())};
  if (layered()) ::unlinkat(dir->get(), whiteout_of(name).c_str(), 0);  // (it shadows the lower name now)
  if (as_root_) {
    UniqueFd made(::openat(dir->get(), name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (made) give_to_caller(req, as_root_, dir->get(), made.get());
  }
  return lookup_entry(p, name);
}

int Filesystem::unlink(fuse_ino_t parent, const char* name, bool dir) {
  Inode& p = inodes_.get(parent);
  if (p.placeholder || p.special != Inode::Special::none) return p.placeholder ? ENOTDIR : EACCES;
  const int rc = remove_name(p, name, dir);
  // A placeholder has no file behind it: its unlink succeeds and removes nothing, as a
  // client that has just seen the name expects (an LNL rank clears a dead holder's marker
  // this way). The name shows again for as long as the entry stays pending (entry_view.hpp).
  if (rc == ENOENT && !dir && is_product_name(name)) {
    Found found;
    if (find(p, name, found) == ENOENT && found.dir && is_placeholder_at(found.dir->get(), name, opts_.retry_failed, opts_.compiler_dir)) return 0;
  }
  return rc;
}

int Filesystem::remove_name(Inode& p, const char* name, bool dir) {
  int err = 0;
  if (layered()) return unlink_layered(p, name, dir);
  PathRef pfd = inodes_.path_fd(p, err);
  if (!pfd) return err;
  if (!dir) client_locks_.forget(pfd->get(), name);
  return ::unlinkat(pfd->get(), name, dir ? AT_REMOVEDIR : 0) == 0 ? 0 : errno;
}

namespace {

// Makes the whiteout of `name` in the folder `dir` (layer 0's copy); 0 or an errno.
int make_whiteout(int dir, const char* name) {
  UniqueFd wh(::openat(dir, whiteout_of(name).c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
  return wh ? 0 : errno;
}

}  // namespace

std::string Filesystem::rel_of(Inode& folder, const char* name) {
  const std::string rel = &folder == &inodes_.root() ? std::string() : inodes_.rel_path(folder);
  return rel.empty() ? std::string(name) : rel + "/" + name;
}

// A removal over layers: from layer 0 (a file of an entry of a lower layer: from the
// entry's copy there), with a whiteout first when a lower layer shows the name too, so
// that no failure halfway ever shows the lower name again.
int Filesystem::unlink_layered(Inode& p, const char* name, bool dir) {
  if (is_layer_name(name)) return ENOENT;
  Found found;
  if (int e = find(p, name, found)) return e;
  if (opts_.scratch && (dir || found.layer != 0 || !is_lock_file_name(name))) return EROFS;
  if (dir && !merged_empty(rel_of(p, name))) return ENOTEMPTY;
  const bool hide = below(p, name);
  int err = 0;
  PathRef up = upper_dir(p, err);
  if (!up) return err;
  if (hide && (err = make_whiteout(up->get(), name)) != 0) return err;
  if (found.layer == 0 || !hide) {  // (an entry's file: its copy in layer 0 now)
    if (dir) {  // the layers' own files in it go with it
      UniqueFd d(::openat(up->get(), name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
      if (d) (void)detail::list_dir(::dup(d.get()), name, [&](std::string_view n, bool) {
          if (is_layer_name(n)) ::unlinkat(d.get(), std::string(n).c_str(), 0);
        });
    } else {
      client_locks_.forget(up->get(), name);
    }
    if (::unlinkat(up->get(), name, dir ? AT_REMOVEDIR : 0) != 0 && errno != ENOENT) return errno;
  }
  return 0;
}

// A rename over layers: only what lives in layer 0 alone moves. Something of a lower layer
// (a file, an entry, a merged folder with names below) answers EXDEV, and mv copies and
// removes it. `pfd`, `npfd`: layer 0's copies of both folders, made here.
int Filesystem::rename_layered(Inode& p, const char* name, Inode& np, const char* newname, unsigned flags,
                               PathRef& pfd, PathRef& npfd) {
  if (int e = may_make(newname)) return e;
  if (opts_.scratch) return EROFS;
  if (is_layer_name(name)) return ENOENT;
  Found from, to;
  if (int e = find(p, name, from)) return e;
  struct stat fst {}, tst {};
  if (::fstat(from.fd.get(), &fst) != 0) return errno;
  const bool from_merged = S_ISDIR(fst.st_mode) && !is_whole_folder(rel_of(p, name));
  // (An opaque folder shows nothing of the layers below: it moves, leaving a whiteout.)
  const bool opaque =
      from_merged && ::faccessat(from.fd.get(), std::string(k_opaque_name).c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0;
  if (from.layer != 0 || (from_merged && !opaque && below(p, name))) return EXDEV;
  const bool to_exists = find(np, newname, to) == 0;
  if (to_exists && ::fstat(to.fd.get(), &tst) != 0) return errno;
  const bool to_below = below(np, newname);
  if (flags & RENAME_EXCHANGE) {
    if (!to_exists || to.layer != 0 || to_below || below(p, name)) return to_exists ? EXDEV : ENOENT;
  } else if (to_exists && to.layer != 0) {
    if (flags & RENAME_NOREPLACE) return EEXIST;
    if (S_ISDIR(tst.st_mode) && !S_ISDIR(fst.st_mode)) return EISDIR;
    if (!S_ISDIR(tst.st_mode) && S_ISDIR(fst.st_mode)) return ENOTDIR;
  }
  // A folder in place of one that shows names of lower layers: only if those are none, as
  // on a disk (LNL's save_cache() onto a key a layer has: ENOTEMPTY).
  if (to_exists && S_ISDIR(tst.st_mode) && !(flags & RENAME_EXCHANGE) && !merged_empty(rel_of(np, newname)))
    return ENOTEMPTY;
  int err = 0;
  if (!(pfd = upper_dir(p, err)) || !(npfd = upper_dir(np, err))) return err;
  // The moved folder hides what lower layers have under its new name; the old name stays
  // hidden where a lower layer has it too. Both are made before the rename, harmless
  // while layer 0 still has the names.
  if (from_merged && !opaque && to_below && !(flags & RENAME_EXCHANGE)) {
    UniqueFd dir(::openat(pfd->get(), name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    UniqueFd marker(dir ? ::openat(dir.get(), std::string(k_opaque_name).c_str(),
                                   O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644)
                        : -1);
    if (!marker) return errno;
  }
  if (!(flags & RENAME_EXCHANGE) && below(p, name))
    if (int e = make_whiteout(pfd->get(), name)) return e;
  return 0;
}

int Filesystem::rename(fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname, unsigned flags) {
  Inode& p = inodes_.get(parent);
  Inode& np = inodes_.get(newparent);
  int err = 0;
  PathRef pfd = inodes_.path_fd(p, err), npfd = pfd ? inodes_.path_fd(np, err) : nullptr;
  if (!pfd || !npfd) return p.special != Inode::Special::none || np.special != Inode::Special::none ? EACCES : err;
  if (layered())
    if (int e = rename_layered(p, name, np, newname, flags, pfd, npfd)) return e;
  if (&np == &inodes_.root() && is_lnl_key(newname) && !(flags & RENAME_EXCHANGE))
    if (int e = promote(pfd->get(), name, npfd->get(), newname, flags); e != 0) return e;
  if (::syscall(SYS_renameat2, pfd->get(), name, npfd->get(), newname, flags) != 0) return errno;
  if (layered()) ::unlinkat(npfd->get(), whiteout_of(newname).c_str(), 0);  // (it shadows the lower name now)
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
  int err = 0;
  if (layered()) {
    if (int e = may_make(newname)) return Errno{e};
    if (!i.placeholder && inodes_.layer_of(i) != 0) return Errno{EXDEV};
    Found found;
    if (find(np, newname, found) == 0) return Errno{EEXIST};
  }
  PathRef fd = inodes_.path_fd(i, err), npfd = fd ? upper_dir(np, err) : nullptr;
  if (!fd || !npfd) return Errno{i.placeholder || i.special != Inode::Special::none ? EPERM : err};
  if (layered()) ::unlinkat(npfd->get(), whiteout_of(newname).c_str(), 0);
  if (::linkat(AT_FDCWD, proc_path(fd->get()).c_str(), npfd->get(), newname, AT_SYMLINK_FOLLOW) != 0) return Errno{errno};
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
  set_listing_caching(opened, layered());  // (over layers, listings change unseen)
  return opened;
}

std::shared_ptr<const Listing> Filesystem::list(Inode& i, int& err) {
  if (i.special == Inode::Special::stats_dir)
    return std::make_shared<Listing>(Listing{{{".", 1, DT_DIR}, {"..", 1, DT_DIR}, {k_stats_file, 2, DT_REG}}});
  if (layered() && (&i == &inodes_.root() || !is_whole_folder(inodes_.rel_path(i)))) return list_merged(i, err);
  PathRef dir = inodes_.path_fd(i, err);
  if (!dir) return nullptr;
  struct stat st {};
  if (::fstat(dir->get(), &st) == 0 && st.st_nlink == 0) return err = ESTALE, nullptr;  // removed meanwhile
  opts_.store->remote().fill_listing(dir->get());
  int fd = ::openat(dir->get(), ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return err = errno, nullptr;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    err = errno;
    UniqueFd close_it(fd);
    return nullptr;
  }
  auto h = std::make_shared<Listing>();
  const std::string path = path_of_fd(fd);
  EntryFiles files = EntryFiles::of_entry_path(path);
  while (dirent* e = ::readdir(d)) {
    // The root's .neffcache is the mount's own (stats.json); a backing folder of that
    // name (an S3 tier's staging) is not shown.
    if (&i == &inodes_.root() && std::strcmp(e->d_name, k_stats_dir) == 0) continue;
    h->push_back({e->d_name, e->d_ino, e->d_type});
    files.note(e->d_name);
  }
  ::closedir(d);
  // A pending entry lists what opening it will produce (entry_view.hpp).
  const bool maybe_entry = files.has_job() && !files.done();
  const bool ours = !maybe_entry || compiles_here(path, opts_.compiler_dir);
  const EntryStage stage = entry_stage(files, maybe_entry && ours && client_compiling_at(dir->get(), files), ours);
  for (auto& name : placeholder_names(files, stage, opts_.retry_failed)) h->push_back({std::move(name), 0, DT_REG});
  return h;
}

int Filesystem::readdir(fuse_ino_t ino, off_t off, bool plus, const AddEntry& add) {
  Inode& dir = inodes_.get(ino);
  if (dir.placeholder) return ENOTDIR;
  std::shared_ptr<const Listing> h;
  if (off > 0) {
    std::lock_guard lk(listings_mu_);
    h = dir.listing;
  }
  if (!h) {
    int err = 0;
    if (!(h = list(dir, err))) return err;
    std::lock_guard lk(listings_mu_);
    dir.listing = h;
  }
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
  if (!any) {  // the end: let the listing go
    std::lock_guard lk(listings_mu_);
    if (dir.listing == h) dir.listing.reset();
  }
  return 0;
}

}  // namespace neffcachefs
