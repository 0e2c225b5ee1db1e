// The namespace's side of layers (namespace.hpp, layers.hpp): finding a name in the first
// layer that has it, merged listings, copies up into layer 0, whiteouts, opaque folders,
// what may be made where.
#include "namespace.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>

#include <fmt/format.h>

#include <neffcache/compile/publish.hpp>
#include <neffcache/core/detail/proc.hpp>

#include "caller.hpp"
#include "layers.hpp"

namespace neffcachefs {

using namespace neffcache;
using detail::UniqueFd;

namespace {

// Reads the names of the folder open as `dir` (any descriptor of it).
template <class F>
bool for_each_name(int dir, F&& f) {
  int fd = ::openat(dir, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  DIR* d = ::fdopendir(fd);
  if (!d) {
    UniqueFd close_it(fd);
    return false;
  }
  while (dirent* e = ::readdir(d)) f(*e);
  ::closedir(d);
  return true;
}

// Gives the file `fd` the owner, mode and times of `st` (the owner only as root).
int take_attributes(int fd, const struct stat& st, bool as_root) {
  if (as_root && ::fchownat(fd, "", st.st_uid, st.st_gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return errno;
  if (!S_ISLNK(st.st_mode) && ::fchmod(fd, st.st_mode & 07777) != 0) return errno;
  if (S_ISLNK(st.st_mode)) return 0;
  const struct timespec times[2] = {st.st_atim, st.st_mtim};
  return ::futimens(fd, times) == 0 ? 0 : errno;
}

// Copies the regular file `in` (`st`) to the new file `out`: its bytes, mode, times and
// (as root) owner.
int copy_content(int in, int out, const struct stat& st, bool as_root) {
  for (off_t left = st.st_size; left > 0;) {
    ssize_t n = ::copy_file_range(in, nullptr, out, nullptr, static_cast<std::size_t>(left), 0);
    if (n < 0 && (errno == EXDEV || errno == EINVAL || errno == ENOSYS)) {  // across file systems, old kernels
      char buf[1 << 16];
      n = ::read(in, buf, sizeof buf);
      if (n > 0 && ::write(out, buf, static_cast<std::size_t>(n)) != n) return errno ? errno : EIO;
    }
    if (n < 0) return errno;
    if (n == 0) break;  // shorter than it was
    left -= n;
  }
  return take_attributes(out, st, as_root);
}

// Copies the file `name` of folder `from` to `to_name` in folder `to` (a new name), with
// its mode, times and (as root) owner: regular files by their bytes, links as links.
int copy_file(int from, const char* name, int to, const char* to_name, bool as_root) {
  struct stat st {};
  if (::fstatat(from, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return errno;
  if (S_ISLNK(st.st_mode)) {
    std::string target(static_cast<std::size_t>(st.st_size) + 1, '\0');
    ssize_t n = ::readlinkat(from, name, target.data(), target.size());
    if (n < 0) return errno;
    target.resize(static_cast<std::size_t>(n));
    if (::symlinkat(target.c_str(), to, to_name) != 0) return errno;
    if (as_root) ::fchownat(to, to_name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
    return 0;
  }
  if (S_ISDIR(st.st_mode)) return 0;  // (an entry has no folders of its own: one is not carried)
  if (!S_ISREG(st.st_mode)) {  // a FIFO or socket: made anew
    if (::mknodat(to, to_name, st.st_mode, 0) != 0) return errno;
    UniqueFd made(::openat(to, to_name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    return made ? take_attributes(made.get(), st, as_root) : errno;
  }
  UniqueFd in(::openat(from, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  if (!in) return errno;
  UniqueFd out(::openat(to, to_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out) return errno;
  return copy_content(in.get(), out.get(), st, as_root);
}

// A name for a copy under way in a folder: renamed into place when whole.
std::string copy_up_name(std::string_view name) {
  return fmt::format("{}{}.{:016x}", k_copy_up_prefix, name, neffcache::detail::random_u64());
}

// Whether the folder open as `dir` is opaque: the layers below show nothing in it.
bool is_opaque(int dir) { return ::faccessat(dir, std::string(k_opaque_name).c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0; }

// Whether the folder open as `dir` has the whiteout of `name`: the layers below do not
// show it.
bool has_whiteout(int dir, const char* name) {
  return ::faccessat(dir, whiteout_of(name).c_str(), F_OK, AT_SYMLINK_NOFOLLOW) == 0;
}

// Makes the whiteout of `name` in the folder `dir` (layer 0's copy); 0 or an errno.
int make_whiteout(int dir, const char* name) {
  UniqueFd wh(::openat(dir, whiteout_of(name).c_str(), O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
  return wh ? 0 : errno;
}

}  // namespace

// A removal over layers: from layer 0 (a file of an entry of a lower layer: from the
// entry's copy there), with a whiteout first when a lower layer shows the name too, so
// that no failure halfway ever shows the lower name again.
int Namespace::remove_layered(Inode& p, const char* name, bool dir, const std::function<void(int dir_fd)>& forget) {
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
      forget(up->get());
    }
    if (::unlinkat(up->get(), name, dir ? AT_REMOVEDIR : 0) != 0 && errno != ENOENT) return errno;
  }
  return 0;
}

// A rename over layers: only what lives in layer 0 alone moves. Something of a lower layer
// (a file, an entry, a merged folder with names below) answers EXDEV, and mv copies and
// removes it. `pfd`, `npfd`: layer 0's copies of both folders, made here.
int Namespace::rename_layered(Inode& p, const char* name, Inode& np, const char* newname, unsigned flags,
                              PathRef& pfd, PathRef& npfd) {
  if (is_layer_name(newname)) return EPERM;
  if (opts_.scratch) return EROFS;
  if (is_layer_name(name)) return ENOENT;
  Found from, to;
  if (int e = find(p, name, from)) return e;
  struct stat fst {}, tst {};
  if (::fstat(from.fd.get(), &fst) != 0) return errno;
  const bool from_merged = S_ISDIR(fst.st_mode) && !is_whole_folder(rel_of(p, name));
  // (An opaque folder shows nothing of the layers below: it moves, leaving a whiteout.)
  const bool opaque = from_merged && is_opaque(from.fd.get());
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

int Namespace::make_opaque_dir(int dir, const char* name, mode_t mode) {
  const std::string tmp = copy_up_name(name);
  if (::mkdirat(dir, tmp.c_str(), mode) != 0) return -1;
  UniqueFd marker(::openat(dir, fmt::format("{}/{}", tmp, k_opaque_name).c_str(),
                           O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
  if (!marker || ::renameat2(dir, tmp.c_str(), dir, name, RENAME_NOREPLACE) != 0) {
    const int err = errno;
    detail::remove_tree_at(dir, tmp);
    errno = err;
    return -1;
  }
  return 0;
}

int Namespace::may_make(Inode& parent, const char* name, Existing existing) {
  if (!layered()) return 0;
  if (int e = may_name(name)) return e;
  return exists(parent, name, existing);
}

int Namespace::may_link(Inode& i, Inode& parent, const char* name) {
  if (!layered()) return 0;
  if (int e = may_name(name)) return e;
  if (!i.placeholder && inodes_.layer_of(i) != 0) return EXDEV;
  return exists(parent, name, Existing::refused);
}

int Namespace::may_name(const char* name) const {
  if (is_layer_name(name)) return EPERM;
  return opts_.scratch && !is_lock_file_name(name) ? EROFS : 0;
}

int Namespace::exists(Inode& parent, const char* name, Existing existing) {
  // (Seen by no lookup yet, a name of a lower layer is there all the same.)
  Found found;
  if (find(parent, name, found) != 0) return 0;
  return existing == Existing::refused || found.layer != 0 ? EEXIST : 0;
}

bool Namespace::new_folder_opaque(Inode& parent, int dir, const char* name) {
  // (An entry folder is taken whole from one layer anyway.)
  return layered() && has_whiteout(dir, name) &&
         !is_whole_folder(rel_of(parent, name));
}

void Namespace::made(int dir, const char* name) {
  if (layered()) ::unlinkat(dir, whiteout_of(name).c_str(), 0);
}

int Namespace::find(Inode& parent, const char* name, Found& f) {
  const std::size_t n = inodes_.layers();
  const bool whole = n == 1 || (&parent != &inodes_.root() && is_whole_folder(inodes_.rel_path(parent)));
  for (std::size_t k = 0; k < n; ++k) {
    int err = 0;
    PathRef dir = whole ? inodes_.path_fd(parent, err) : inodes_.dir_in_layer(parent, k, err);
    if (!dir) {
      if (err == ENOENT && !whole) continue;
      return err;
    }
    if (!f.dir) f.dir = dir;  // the topmost copy, where a missing name is made
    f.fd = UniqueFd(::openat(dir->get(), name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (f.fd) {
      f.dir = dir;
      f.layer = whole ? inodes_.layer_of(parent) : static_cast<int>(k);
      return 0;
    }
    if (errno != ENOENT || whole) return gone_or(errno, dir->get());
    if (has_whiteout(dir->get(), name) || is_opaque(dir->get())) break;
  }
  return ENOENT;
}

bool Namespace::below(Inode& parent, const char* name) {
  if (!layered() || (&parent != &inodes_.root() && is_whole_folder(inodes_.rel_path(parent)))) return false;
  for (std::size_t k = 0; k < inodes_.layers(); ++k) {
    int err = 0;
    PathRef dir = inodes_.dir_in_layer(parent, k, err);
    if (!dir) continue;
    if (k > 0 && ::faccessat(dir->get(), name, F_OK, AT_SYMLINK_NOFOLLOW) == 0) return true;
    if (k > 0 && has_whiteout(dir->get(), name)) return false;
    if (is_opaque(dir->get())) return false;
  }
  return false;
}

int Namespace::writable(Inode& i) {
  // (The root of a read-only cache is the scratch folder's, dressed as the cache's root.)
  if (opts_.scratch && &i == &inodes_.root()) return EROFS;
  if (!layered() || inodes_.layer_of(i) == 0) return 0;
  if (opts_.scratch && !is_lock_file_name(inodes_.name_of(i))) return EROFS;
  if (int e = copy_up(i)) return e;
  // (Never a lower layer's file, whatever happened meanwhile.)
  return inodes_.layer_of(i) == 0 ? 0 : ESTALE;
}

int Namespace::own_content(Inode& i, const struct stat& st) {
  // (A file of a lower layer gets its own in the copy up.)
  if (!S_ISREG(st.st_mode) || st.st_nlink < 2 || inodes_.layer_of(i) != 0) return 0;
  const std::filesystem::path rel = inodes_.rel_path(i);
  const std::string folder = rel.parent_path().filename().string();
  if (!is_entry_folder(folder) || rel.filename() != EntryFiles::of_folder(folder).neff_name()) return 0;
  // The split failed at the kernel's second look: its error, once (the next write tries again).
  if (int e = i.unshare_error.exchange(0)) return e;
  // The open names the inode, which all its names share: the kernel's second look names
  // the one written (lookup_backing gives it its own file then).
  i.unshare = true;
  return ESTALE;
}

int Namespace::unshared(Inode& parent, int dir_fd, const char* name, Node& n) {
  Inode& shared = *n.inode;
  auto cannot = [&](int e) {
    shared.unshare_error = e ? e : EIO;
    fmt::print(stderr, "neffcachefs: {}/{}: cannot give it a file of its own before it is written: {}\n",
               path_of_fd(dir_fd), name, std::strerror(shared.unshare_error));
    return 0;
  };
  // Copied whole, then renamed over `name`. Into a file without a name where the file
  // system allows it, linked only for the moment before the rename: a listing of an LNL
  // entry (which LNL copies) then never shows a part.
  UniqueFd in(::openat(dir_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC));
  struct stat st {};
  if (!in || ::fstat(in.get(), &st) != 0) return cannot(errno);
  const std::string tmp = copy_up_name(name);
  UniqueFd out(::openat(dir_fd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600));
  const bool unnamed = static_cast<bool>(out);
  if (!unnamed) out = UniqueFd(::openat(dir_fd, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
  if (!out) return cannot(errno);
  int err = copy_content(in.get(), out.get(), st, as_root_);
  // (Through /proc: a link by descriptor itself needs CAP_DAC_READ_SEARCH.)
  if (!err && unnamed &&
      ::linkat(AT_FDCWD, fmt::format("/proc/self/fd/{}", out.get()).c_str(), dir_fd, tmp.c_str(), AT_SYMLINK_FOLLOW) != 0)
    err = errno;
  if (!err && ::renameat(dir_fd, tmp.c_str(), dir_fd, name) != 0) err = errno;
  if (err) {
    ::unlinkat(dir_fd, tmp.c_str(), 0);
    return cannot(err);
  }
  // The name is the copy's now: never answered with the shared inode.
  UniqueFd own(::openat(dir_fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
  Node copy;
  if (!own || ::fstat(own.get(), &copy.attr) != 0) return errno ? errno : EIO;
  copy.inode = inodes_.intern(parent, name, std::move(own), copy.attr);
  inodes_.forget(inodes_.id_of(&shared), 1);
  n = copy;
  return 0;
}

PathRef Namespace::upper_dir(Inode& dir, int& err) {
  if (layered()) {
    if ((err = copy_up(dir)) != 0) return nullptr;
    if (inodes_.layer_of(dir) != 0) return err = ESTALE, nullptr;
  }
  return inodes_.path_fd(dir, err);
}

int Namespace::copy_up(Inode& i) {
  if (&i == &inodes_.root() || inodes_.layer_of(i) == 0) return 0;
  const std::string rel = inodes_.rel_path(i);
  const auto slash = rel.rfind('/');
  const std::string parent_rel = slash == std::string::npos ? std::string() : rel.substr(0, slash);
  const std::string name = slash == std::string::npos ? rel : rel.substr(slash + 1);
  // Pinned: a lookup or rename elsewhere may move `i` to another folder meanwhile.
  struct Pin {
    InodeTable& table;
    Inode* in;
    ~Pin() { table.unpin(in); }
  } pin{inodes_, inodes_.pin_parent(i)};
  Inode& parent = *pin.in;
  // The inode is the copy from now on; false when another inode is (a lookup met the copy
  // first), and then the kernel is told to look the name up again.
  auto rebind = [&](UniqueFd fd) {
    struct stat st {};
    if (!fd || ::fstat(fd.get(), &st) != 0) return ESTALE;
    return inodes_.rebind(i, std::move(fd), st, 0) ? 0 : ESTALE;
  };
  int err = 0;
  PathRef lower = inodes_.path_fd(i, err);
  if (!lower) return err;
  if (!parent_rel.empty() && is_whole_folder(parent_rel)) {
    // A file of an entry: the entry goes up whole, and the file is its copy there.
    if ((err = copy_up(parent)) != 0) return err;
    PathRef dir = inodes_.path_fd(parent, err);
    if (!dir) return err;
    return rebind(UniqueFd(::openat(dir->get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC)));
  }
  PathRef to = upper_dir(parent, err);
  if (!to) return err;
  struct stat st {};
  if (::fstat(lower->get(), &st) != 0) return errno;
  // Made under a private name and renamed into place whole: a copy cut short by a crash
  // is never seen (and its leftover is never listed).
  const std::string tmp = copy_up_name(name);
  if (S_ISDIR(st.st_mode)) {
    {
      CallersMode exact;
      if (::mkdirat(to->get(), tmp.c_str(), 0700) != 0) return errno;
    }
    // An entry goes up with its files; any other folder empty, its names merging in.
    UniqueFd made(::openat(to->get(), tmp.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!made) {
      err = errno;
      detail::remove_tree_at(to->get(), tmp);
      return err;
    }
    if (is_whole_folder(rel)) {
      for_each_name(lower->get(), [&](const dirent& e) {
        if (err || e.d_type == DT_DIR || std::strcmp(e.d_name, ".") == 0 || std::strcmp(e.d_name, "..") == 0) return;
        err = copy_file(lower->get(), e.d_name, made.get(), e.d_name, as_root_);
      });
    }
    if (!err) err = take_attributes(made.get(), st, as_root_);
  } else {
    PathRef from = inodes_.dir_in_layer(parent, static_cast<std::size_t>(inodes_.layer_of(i)), err);
    if (!from) return err;
    err = copy_file(from->get(), name.c_str(), to->get(), tmp.c_str(), as_root_);
  }
  if (!err && ::renameat2(to->get(), tmp.c_str(), to->get(), name.c_str(), RENAME_NOREPLACE) != 0 && errno != EEXIST)
    err = errno;  // EEXIST: another request copied it up first
  detail::remove_tree_at(to->get(), tmp);
  if (err) return err;
  return rebind(UniqueFd(::openat(to->get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC)));
}

std::shared_ptr<const Listing> Namespace::list_merged(Inode& i, int& err) {
  auto h = std::make_shared<Listing>();
  std::set<std::string, std::less<>> seen, hidden;
  bool any = false;
  for (std::size_t k = 0; k < inodes_.layers(); ++k) {
    PathRef dir = inodes_.dir_in_layer(i, k, err);
    if (!dir) {
      if (err == ENOENT) continue;
      return nullptr;
    }
    std::vector<std::string> whiteouts;
    any |= for_each_name(dir->get(), [&](const dirent& e) {
      std::string_view name(e.d_name);
      if (name.starts_with(k_whiteout_prefix)) whiteouts.emplace_back(name.substr(k_whiteout_prefix.size()));
      if (is_layer_name(name) || (&i == &inodes_.root() && name == Stats::k_dir)) return;
      if (hidden.contains(name) || !seen.emplace(name).second) return;
      h->push_back({e.d_name, e.d_ino, e.d_type});
    });
    hidden.insert(whiteouts.begin(), whiteouts.end());
    if (is_opaque(dir->get())) break;
  }
  if (!any) return err = ESTALE, nullptr;
  err = 0;
  return h;
}

bool Namespace::merged_empty(const std::string& rel) {
  std::set<std::string, std::less<>> hidden;
  for (std::size_t k = 0; k < inodes_.layers(); ++k) {
    UniqueFd dir = open_beneath(inodes_.layer_root(k)->get(), rel, O_PATH | O_DIRECTORY);
    if (!dir) continue;
    bool empty = true;
    std::vector<std::string> whiteouts;
    for_each_name(dir.get(), [&](const dirent& e) {
      std::string_view name(e.d_name);
      if (name.starts_with(k_whiteout_prefix)) whiteouts.emplace_back(name.substr(k_whiteout_prefix.size()));
      if (name == "." || name == ".." || is_layer_name(name) || hidden.contains(name)) return;
      empty = false;
    });
    if (!empty) return false;
    if (is_whole_folder(rel) || is_opaque(dir.get())) return true;  // an entry: its first copy alone
    hidden.insert(whiteouts.begin(), whiteouts.end());
  }
  return true;
}

}  // namespace neffcachefs
