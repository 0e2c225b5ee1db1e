// The namespace (namespace.hpp): lookups, listings, removals and renames. Its layers'
// side is in namespace_layers.cpp.
#include "namespace.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/cache/maintenance.hpp>

#include "entry_view.hpp"
#include "layers.hpp"
#include "stats.hpp"

namespace neffcachefs {

using namespace neffcache;
using detail::UniqueFd;

namespace {

// Removes an entry's lock once its owner is gone, as `neffcache clear-locks` would; live
// locks stay. A compile takes a stale lock over anyway, but no compile comes for an
// entry whose publisher was killed after model.neff was in place (done, or whole and
// awaiting model.done), and its lock would stay for good.
void remove_stale_lock(int entry_fd) {
  for (std::string_view hlo : {k_hlo_module_file, k_hlo_legacy_file}) {
    const std::string lock = fmt::format("{}{}", hlo, k_lock_suffix);
    if (::faccessat(entry_fd, lock.c_str(), F_OK, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (auto dir = path_of_fd(entry_fd); !dir.empty()) (void)clear_stale_lock(EntryPaths::plain(dir));
    return;
  }
}

}  // namespace

Namespace::Namespace(const Options& opts) : opts_(opts), inodes_(opts.backing, opts.lowers) {}

std::string Namespace::rel_of(Inode& folder, const char* name) {
  const std::string rel = &folder == &inodes_.root() ? std::string() : inodes_.rel_path(folder);
  return rel.empty() ? std::string(name) : rel + "/" + name;
}

Answer<Node> Namespace::lookup(Inode& parent, const char* name) {
  // The counters live in a folder of the mount only; the backing store never has it.
  Inode* special = nullptr;
  if (&parent == &inodes_.root() && std::strcmp(name, Stats::k_dir) == 0) special = &inodes_.stats_dir();
  if (&parent == &inodes_.stats_dir()) {
    if (std::strcmp(name, Stats::k_file) != 0) return Errno{ENOENT};
    special = &inodes_.stats_file();
  }
  if (special) return Node{special, NodeKind::special, {}};
  if (parent.placeholder) return Errno{ENOTDIR};
  // The kernel resolves "." and ".." itself; refusing them here keeps the root a wall.
  if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0 || std::strchr(name, '/')) return Errno{EINVAL};
  return lookup_backing(parent, name);
}

Answer<Node> Namespace::lookup_backing(Inode& parent, const char* name) {
  if (layered() && is_layer_name(name)) return Errno{ENOENT};
  Found found;
  int err = find(parent, name, found);
  // Not here yet: the store's remote may have it.
  if (err == ENOENT && found.dir && opts_.store->remote().fill(found.dir->get(), name))
    err = find(parent, name, found = {});
  if (err == ENOENT && found.dir && is_product_name(name)) {
    if (is_placeholder_at(found.dir->get(), name, opts_.retry_failed, opts_.compiler_dir)) {
      // A placeholder for what a compile will produce.
      Node n{inodes_.intern_placeholder(parent, name), NodeKind::placeholder, {}};
      n.attr.st_ino = static_cast<ino_t>(inodes_.id_of(n.inode) & 0x7fffffffffffULL);
      n.attr.st_mode = S_IFREG | 0444;
      n.attr.st_nlink = 1;
      return n;
    }
    // No placeholder: nothing will make the name, or a publish made it between the two
    // looks (the name, then the folder's listing), and a disk would show the file. A
    // publish only ever adds the name: one more look settles it.
    err = find(parent, name, found = {});
  }
  PathRef dir = std::move(found.dir);
  UniqueFd fd = std::move(found.fd);
  if (err) {
    if (err == EMFILE && dir && !told_out_of_fds_.exchange(true)) {
      struct rlimit rl {};
      ::getrlimit(RLIMIT_NOFILE, &rl);
      fmt::print(stderr,
                 "neffcachefs: out of file descriptors (limit {}, of which up to {} for names): lookups fail "
                 "with EMFILE; raise the limit (LimitNOFILE= in the unit, ulimit -n)\n",
                 rl.rlim_cur, inodes_.max_open());
    }
    return Errno{err};
  }
  Node n;
  if (::fstat(fd.get(), &n.attr) != 0) return Errno{errno};
  // A done entry and its files: their names never change while the entry exists.
  const std::string done(k_done_file);
  const bool finished = S_ISREG(n.attr.st_mode)   ? ::faccessat(dir->get(), done.c_str(), F_OK, 0) == 0
                        : S_ISDIR(n.attr.st_mode) ? ::faccessat(fd.get(), done.c_str(), F_OK, 0) == 0
                                                  : false;
  // (Never in a read-only layer: nothing there is written.)
  if (S_ISDIR(n.attr.st_mode) && found.layer == 0 && std::string_view(name).starts_with(k_module_dir_prefix))
    remove_stale_lock(fd.get());
  n.inode = inodes_.intern(parent, name, std::move(fd), n.attr, found.layer);
  if (finished) {
    n.inode->finished = true;
    if (std::string_view(name) == k_neff_file) n.inode->finished_neff = true;
  }
  n.kind = finished ? NodeKind::finished : NodeKind::plain;
  return n;
}

std::shared_ptr<const Listing> Namespace::listing(Inode& dir, off_t off, int& err) {
  std::shared_ptr<const Listing> h;
  if (off > 0) {
    std::lock_guard lk(listings_mu_);
    h = dir.listing;
  }
  if (h) return h;
  if (!(h = list(dir, err))) return nullptr;
  std::lock_guard lk(listings_mu_);
  dir.listing = h;
  return h;
}

void Namespace::done_listing(Inode& dir, const std::shared_ptr<const Listing>& h) {
  std::lock_guard lk(listings_mu_);
  if (dir.listing == h) dir.listing.reset();
}

std::shared_ptr<const Listing> Namespace::list(Inode& i, int& err) {
  if (i.special == Inode::Special::stats_dir)
    return std::make_shared<Listing>(Listing{{{".", 1, DT_DIR}, {"..", 1, DT_DIR}, {Stats::k_file, 2, DT_REG}}});
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
    if (&i == &inodes_.root() && std::strcmp(e->d_name, Stats::k_dir) == 0) continue;
    h->push_back({e->d_name, e->d_ino, e->d_type});
    files.note(e->d_name);
  }
  ::closedir(d);
  // A pending entry lists what opening it will produce (entry_view.hpp).
  const EntryStage stage = entry_stage_at(dir->get(), path, files, opts_.compiler_dir);
  for (auto& name : placeholder_names(files, stage, opts_.retry_failed)) h->push_back({std::move(name), 0, DT_REG});
  return h;
}

int Namespace::remove(Inode& p, const char* name, bool dir, const std::function<void(int dir_fd)>& forget) {
  if (layered()) return remove_layered(p, name, dir, forget);
  int err = 0;
  PathRef pfd = inodes_.path_fd(p, err);
  if (!pfd) return err;
  if (!dir) forget(pfd->get());
  return ::unlinkat(pfd->get(), name, dir ? AT_REMOVEDIR : 0) == 0 ? 0 : errno;
}

bool Namespace::is_placeholder(Inode& p, const char* name) {
  if (!is_product_name(name)) return false;
  Found found;
  return find(p, name, found) == ENOENT && found.dir &&
         is_placeholder_at(found.dir->get(), name, opts_.retry_failed, opts_.compiler_dir);
}

int Namespace::prepare_rename(Inode& p, const char* name, Inode& np, const char* newname, unsigned flags,
                              PathRef& pfd, PathRef& npfd) {
  int err = 0;
  pfd = inodes_.path_fd(p, err);
  npfd = pfd ? inodes_.path_fd(np, err) : nullptr;
  if (!pfd || !npfd) return p.special != Inode::Special::none || np.special != Inode::Special::none ? EACCES : err;
  return layered() ? rename_layered(p, name, np, newname, flags, pfd, npfd) : 0;
}

}  // namespace neffcachefs
