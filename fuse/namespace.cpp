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
#include <filesystem>

#include <fmt/format.h>

#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/cache/maintenance.hpp>

#include "client_locks.hpp"
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

// The process's umask, from /proc (umask() would change it for a moment, for every thread).
static mode_t process_umask() {
  auto status = detail::read_file("/proc/self/status");
  const std::string_view field = "\nUmask:\t";
  if (auto at = status ? status->find(field) : std::string::npos; at != std::string::npos)
    return static_cast<mode_t>(std::strtoul(status->c_str() + at + field.size(), nullptr, 8));
  return 022;
}

Namespace::Namespace(const Options& opts)
    : opts_(opts), umask_(process_umask()), inodes_(opts.backing, opts.lowers) {}

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
  // Not here yet: the store's remote may have it. (Not a lock: held_elsewhere below asks
  // the remote about it, within its bound.)
  if (err == ENOENT && found.dir && !ClientLocks::is_lock_name(name) && opts_.store->remote().fill(found.dir->get(), name))
    err = find(parent, name, found = {});
  if (err == ENOENT && found.dir && is_product_name(name)) {
    const auto look = look_at(found.dir->get(), opts_.compiler_dir, may_finish(parent));
    // Our own publish to finish: the marker shows at once, and is written soon.
    if (look && look->stage == EntryStage::unfinished && unfinished_) unfinished_(look->path);
    if (auto attr = look ? neffcachefs::placeholder_attr(found.dir->get(), *look, name, opts_.retry_failed, umask_)
                         : std::nullopt) {
      // A placeholder for what a compile will produce, with the attributes it will have.
      Node n{inodes_.intern_placeholder(parent, name), NodeKind::placeholder, *attr};
      n.attr.st_ino = static_cast<ino_t>(inodes_.id_of(n.inode) & 0x7fffffffffffULL);
      return n;
    }
    // No placeholder: nothing will make the name, or a publish made it between the two
    // looks (the name, then the folder's listing), and a disk would show the file. A
    // publish only ever adds the name: one more look settles it.
    err = find(parent, name, found = {});
  }
  // Another host holds the entry: its lock file, which a client here polls, as on a folder
  // both hosts share. (Asked of the remote at each lookup: the kernel keeps none.)
  if (err == ENOENT && found.dir && ClientLocks::is_lock_name(name))
    if (auto attr = shown_lock_attr(found.dir->get(), name)) {
      Node n{inodes_.intern_placeholder(parent, name), NodeKind::placeholder, *attr};
      n.attr.st_ino = static_cast<ino_t>(inodes_.id_of(n.inode) & 0x7fffffffffffULL);
      return n;
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
  // A done entry (by its clients' hit test, in either dialect) and its files. The open of
  // its NEFF is a hit. What the kernel may keep (finished) is what changes only through
  // the mount, where an open that writes it ends that (Filesystem::open):
  //   - a done Neuron entry: its folder and files (a publish renames new inodes into place);
  //   - a done LNL entry: its NEFF alone. A rank writes into the entry at every hit
  //     (.cache_accessed), may remove the marker (a dead holder's) and then compiles the
  //     key again, writing graph.hlo and the NEFF through the mount.
  // Never a lock file: ours (a fetch, the end of a publish) and a client's go once the
  // entry is done, ours behind the kernel's back, and a rank that polls the name must see
  // it go.
  const Seen seen = S_ISDIR(n.attr.st_mode) ? seen_as(fd.get(), name, name, n.attr.st_mode)
                                            : seen_as(dir->get(), inodes_.name_of(parent), name, n.attr.st_mode);
  // (Never in a read-only layer: nothing there is written.)
  if (S_ISDIR(n.attr.st_mode) && found.layer == 0 && std::string_view(name).starts_with(k_module_dir_prefix))
    remove_stale_lock(fd.get());
  n.inode = inodes_.intern(parent, name, std::move(fd), n.attr, found.layer);
  // A write of a twin asked for its name to get a file of its own (own_content).
  if (seen.neff && found.layer == 0 && n.attr.st_nlink > 1 && n.inode->unshare.exchange(false))
    if (int e = unshared(parent, dir->get(), name, n)) {
      inodes_.forget(inodes_.id_of(n.inode), 1);
      return Errno{e};
    }
  // (Set first, then undone if a writer came meanwhile: Filesystem::changing counts the
  // writer before it clears the flag.)
  n.inode->finished = seen.kept;
  if (n.inode->writers != 0) n.inode->finished = false;
  const bool finished = n.inode->finished;
  if (S_ISREG(n.attr.st_mode)) n.inode->done_neff = seen.done && seen.neff;
  n.kind = finished ? NodeKind::finished : NodeKind::plain;
  return n;
}

Namespace::Seen Namespace::seen_as(int entry_fd, const std::string& folder, const char* name, mode_t mode) {
  Seen s;
  s.done = (S_ISREG(mode) || S_ISDIR(mode)) && is_entry_folder(folder) && done_at(entry_fd, folder);
  const EntryFiles files = EntryFiles::of_folder(folder);
  s.neff = S_ISREG(mode) && name == files.neff_name();
  s.kept = s.done && !ClientLocks::is_lock_name(name) && (!files.is_lnl() || s.neff);
  return s;
}

void Namespace::written(Inode& i) {
  Inode* parent = inodes_.pin_parent(i);
  if (!parent) return;
  int err = 0;
  PathRef dir = inodes_.path_fd(*parent, err), self = inodes_.path_fd(i, err);
  struct stat st {};
  if (dir && self && ::fstat(self->get(), &st) == 0 && st.st_nlink > 0) {
    i.finished = seen_as(dir->get(), inodes_.name_of(*parent), inodes_.name_of(i).c_str(), st.st_mode).kept;
    if (i.writers != 0) i.finished = false;
  }
  inodes_.unpin(parent);
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
  // Placeholders are found by lookups, never listed (entry_view.hpp). An entry folder with
  // no graph yet (a client made it) shows another host's lock, as a shared folder would.
  if (!files.has_job()) {
    if (is_entry_folder(std::filesystem::path(path).filename().string()))
      for (auto& name : opts_.store->remote().names_elsewhere(dir->get())) h->push_back({std::move(name), 0, DT_REG});
    return h;
  }
  note_own_files(dir->get(), files);
  // (An unfinished publish of ours is finished at a lookup of its marker, a client's look,
  // never at a listing: a walker that removes or copies the folder must find it as it is.)
  const EntryStage stage = entry_stage_at(dir->get(), path, files, opts_.compiler_dir, may_finish(i));
  // What a pending entry holds elsewhere (a bucket's done entry, fetched when opened) is
  // its own: names a lookup finds as its placeholders.
  if (stage == EntryStage::pending)
    for (auto& name : opts_.store->remote().names_elsewhere(dir->get())) h->push_back({std::move(name), 0, DT_REG});
  return h;
}

int Namespace::remove(Inode& p, const char* name, bool dir, const std::function<void(int dir_fd)>& forget) {
  int rc = 0;
  if (layered()) {
    rc = remove_layered(p, name, dir, forget);
  } else {
    int err = 0;
    PathRef pfd = inodes_.path_fd(p, err);
    if (!pfd) return err;
    if (!dir) forget(pfd->get());
    rc = ::unlinkat(pfd->get(), name, dir ? AT_REMOVEDIR : 0) == 0 ? 0 : errno;
  }
  // An LNL key folder removed (shutil.rmtree through the mount): our files of that entry,
  // outside its folder, go with it.
  if (rc == 0 && dir && &p == &inodes_.root() && is_lnl_key(name))
    detail::remove_own_results(fmt::format("{}/{}", opts_.backing, name));
  return rc;
}

bool Namespace::is_placeholder(Inode& p, const char* name) {
  if (!is_product_name(name) && !ClientLocks::is_lock_name(name)) return false;
  Found found;
  return find(p, name, found) == ENOENT && found.dir && placeholder_attr(p, found.dir->get(), name).has_value();
}

std::optional<struct stat> Namespace::placeholder_attr(Inode& parent, int dir_fd, const std::string& name) {
  if (ClientLocks::is_lock_name(name.c_str())) return shown_lock_attr(dir_fd, name.c_str());
  const auto look = look_at(dir_fd, opts_.compiler_dir, may_finish(parent));
  if (!look) return std::nullopt;
  return neffcachefs::placeholder_attr(dir_fd, *look, name, opts_.retry_failed, umask_);
}

std::optional<struct stat> Namespace::shown_lock_attr(int dir_fd, const char* name) {
  if (!opts_.store->remote().held_elsewhere(dir_fd, name)) return std::nullopt;
  // A lock file as a client of this host would have made it (open_shown_lock makes it so):
  // empty, the daemon's mode less its umask; the folder's owner and times.
  struct stat dir {}, st {};
  if (::fstat(dir_fd, &dir) != 0) return std::nullopt;
  st.st_mode = S_IFREG | (0666 & ~umask_);
  st.st_nlink = 1;
  st.st_uid = dir.st_uid;
  st.st_gid = dir.st_gid;
  st.st_atim = st.st_mtim = st.st_ctim = dir.st_mtim;
  st.st_blksize = dir.st_blksize;
  return st;
}

bool Namespace::may_finish(Inode& folder) { return !opts_.scratch && inodes_.layer_of(folder) == 0; }

int Namespace::prepare_rename(Inode& p, const char* name, Inode& np, const char* newname, unsigned flags,
                              PathRef& pfd, PathRef& npfd) {
  int err = 0;
  pfd = inodes_.path_fd(p, err);
  npfd = pfd ? inodes_.path_fd(np, err) : nullptr;
  if (!pfd || !npfd) return p.special != Inode::Special::none || np.special != Inode::Special::none ? EACCES : err;
  return layered() ? rename_layered(p, name, np, newname, flags, pfd, npfd) : 0;
}

}  // namespace neffcachefs
