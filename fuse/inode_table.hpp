// The inode table: which backing file each inode number names, the kernel's references
// to it, and the O_PATH descriptors kept open for the most recently used inodes.
//
// Inodes are backing files keyed by (st_dev, st_ino), as in libfuse's passthrough_hp,
// but an inode does not pin a descriptor: it knows its parent and name, and its O_PATH
// descriptor is kept open only while it is among the most recently used (half the
// descriptor limit). A walk of a large cache makes the kernel remember more names than
// a process may open files. Reopening checks (st_dev, st_ino): a name that now holds
// another file answers ESTALE, and the kernel looks the name up again.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <neffcache/core/detail/fs.hpp>

namespace neffcachefs {

static_assert(sizeof(fuse_ino_t) >= sizeof(void*), "inode numbers carry pointers");

// An open O_PATH descriptor, closed when its last user lets go of it.
struct PathFd {
  neffcache::detail::UniqueFd fd;
  explicit PathFd(neffcache::detail::UniqueFd f) : fd(std::move(f)) {}
  int get() const { return fd.get(); }
};
using PathRef = std::shared_ptr<const PathFd>;

// One name of a folder as the mount lists it.
struct DirEnt {
  std::string name;
  ino_t ino;
  unsigned char type;
};
using Listing = std::vector<DirEnt>;

struct Inode {
  enum class Special { none, stats_dir, stats_file };
  Special special = Special::none;
  // Guarded by InodeTable::inodes_mu_ (a copy up moves them: InodeTable::rebind): the
  // backing file, and the layer it is in (0: the backing folder; 1 on: the read-only
  // layers under it, layers.hpp).
  dev_t dev = 0;
  ino_t ino = 0;
  int layer = 0;
  bool placeholder = false;  // model.neff or model.done of a pending entry; another host's lock file
  // A file of a done entry the kernel may keep (NodeKind::finished), as its last lookup
  // found it and while no open writes it (namespace.cpp says which files).
  std::atomic<bool> finished{false};
  // Opens of it that write (or truncated it), under way: it is not finished meanwhile.
  std::atomic<uint32_t> writers{0};
  // A write of this NEFF, one of our hard-linked twins, was answered ESTALE: the next
  // lookup of one of its names gives that name a file of its own (Namespace::own_content),
  // or leaves here why it could not, which the retried write then gets.
  std::atomic<bool> unshare{false};
  std::atomic<int> unshare_error{0};
  // The NEFF of a done entry, of either dialect, as its last lookup found it: an open of
  // it to read is a hit, counted, and names its entry in stats.json's `opened`.
  std::atomic<bool> done_neff{false};
  // Its entry was offered to the content index once (Indexer::seen): later hits skip it.
  std::atomic<bool> index_offered{false};
  // Guarded by InodeTable::inodes_mu_ (a placeholder's never change): where the inode
  // was last seen, which is how its descriptor is opened again.
  Inode* parent = nullptr;
  std::string name;
  uint64_t nlookup = 0;  // the kernel's references
  uint64_t refs = 0;     // ours: inodes whose parent this is, and reopens under way
  // Guarded by InodeTable::fds_mu_: the descriptor while the inode is in open_lru_.
  PathRef fd;
  std::list<Inode*>::iterator lru;
  // Guarded by Filesystem::listings_mu_: a folder's listing while the kernel reads it.
  std::shared_ptr<const Listing> listing;
  // Guarded by Passthrough::mu_ (passthrough.hpp): the backing file registered with the
  // kernel while opens pass through, and the opens of each kind.
  int backing_id = 0;
  bool backing_lower = false;  // it is a read-only lower layer's file
  uint32_t backing_opens = 0;
  uint32_t cached_opens = 0;
  bool backing_registering = false;  // an open registers its backing file now
};

class InodeTable {
 public:
  // `backing`: the absolute path of the backing folder (the root inode); `lowers`: the
  // read-only layers under it, in order (layers.hpp). `max_open`: how many O_PATH
  // descriptors stay open; 0 for half the descriptor limit (at least 64).
  explicit InodeTable(const std::string& backing, const std::vector<std::string>& lowers = {},
                      std::size_t max_open = 0);
  // Frees every inode: the kernel sends no FORGET for what it still remembers at unmount.
  ~InodeTable();
  InodeTable(const InodeTable&) = delete;
  InodeTable& operator=(const InodeTable&) = delete;

  Inode& get(fuse_ino_t ino) { return ino == FUSE_ROOT_ID ? *root_ : *reinterpret_cast<Inode*>(ino); }
  fuse_ino_t id_of(const Inode* i) const {
    return i == root_.get() ? FUSE_ROOT_ID : reinterpret_cast<fuse_ino_t>(i);
  }
  Inode& root() { return *root_; }
  const PathRef& root_fd() const { return root_fd_; }
  Inode& stats_dir() { return *stats_dir_; }
  Inode& stats_file() { return *stats_file_; }
  // By inode number alone: the hot paths (read, flush, locks) need not touch an Inode
  // that a FORGET on another thread may free once the kernel is done with it. (The
  // kernel orders the two, but no sanitizer can see that.)
  bool is_special(fuse_ino_t ino) const { return is_stats_file(ino) || ino == reinterpret_cast<fuse_ino_t>(stats_dir_.get()); }
  bool is_stats_file(fuse_ino_t ino) const { return ino == reinterpret_cast<fuse_ino_t>(stats_file_.get()); }
  std::size_t max_open() const { return max_open_; }

  // The inode of backing file `st` at `name` in `parent` (in layer `layer`), counting one
  // more kernel lookup; the name seen last is where it is opened again (hard links,
  // renames by other processes). Keeps `path_fd` as its descriptor.
  Inode* intern(Inode& parent, const char* name, neffcache::detail::UniqueFd path_fd, const struct stat& st,
                int layer = 0);

  // Layers (layers.hpp): how many (1: the backing alone), the root of layer `k`, and an
  // inode's layer and path below the root ("" for the root).
  std::size_t layers() const { return layer_roots_.size(); }
  const PathRef& layer_root(std::size_t k) const { return layer_roots_[k]; }
  int layer_of(Inode& i);
  // The folder inode `i` was last seen in, with a reference of ours that keeps it alive
  // (a rename or a lookup elsewhere may move `i` meanwhile) until unpin().
  Inode* pin_parent(Inode& i);
  void unpin(Inode* in);
  std::string rel_path(Inode& i);
  // The O_PATH descriptor of folder `dir`'s copy in layer `k`: its own when it is there,
  // else its path below that layer's root, through no link; null with `err` (ENOENT:
  // that layer has no such folder).
  PathRef dir_in_layer(Inode& dir, std::size_t k, int& err);
  // After a copy up: inode `i` is now the file `fd` (`st`) of layer `layer`. False (and
  // nothing changed) when another inode already is that file (a lookup met the copy
  // first): the caller answers ESTALE, and the kernel looks the name up again.
  bool rebind(Inode& i, neffcache::detail::UniqueFd fd, const struct stat& st, int layer);
  // The placeholder `name` in `parent` (no backing file yet), one more kernel lookup.
  Inode* intern_placeholder(Inode& parent, const char* name);
  // The inode's O_PATH descriptor, opened again from its parent if it was let go.
  // Null with `err` set when the inode is gone or replaced (ESTALE), is a placeholder or
  // special (ENOENT), or cannot be opened.
  PathRef path_fd(Inode& i, int& err);
  // Drops `n` kernel references (FORGET); an inode no longer referenced is freed.
  void forget(fuse_ino_t ino, uint64_t n);
  // After a rename through the mount: the inode now at `name` in `parent` is known there.
  void moved(Inode& parent, int parent_fd, const char* name);
  std::string name_of(Inode& i);
  // The inode number of the backing file `st`, if the kernel knows it (a lookup gave it
  // out and no FORGET took it back yet): what a notification names.
  std::optional<fuse_ino_t> known(const struct stat& st);
  // The backing path of the inode; empty when it cannot be opened.
  std::string path_of(Inode& i);

  // For tests and the log: how many inodes are listed and how many descriptors are open.
  struct Census {
    std::size_t inodes = 0, placeholders = 0, open = 0;
  };
  Census census();

 private:
  // Keeps `fd` as the inode's descriptor if the inode is still the file (`dev`, `ino`) it
  // was opened as; nullptr when a copy up rebound it meanwhile.
  PathRef keep_open(Inode& i, PathRef fd, dev_t dev, ino_t ino);
  // Under inodes_mu_: drops `nlookup` kernel references, or one of ours when it is 0;
  // inodes no longer referenced are unlisted and appended to `doomed`.
  void unref(Inode* in, uint64_t nlookup, std::vector<Inode*>& doomed);
  void set_parent(Inode* in, Inode& parent, const char* name, std::vector<Inode*>& doomed);
  // Without inodes_mu_: closes the doomed inodes' descriptors and frees them.
  void destroy(const std::vector<Inode*>& doomed);

  // Under inodes_mu_: the path of `i` below the root.
  std::string rel_path_locked(const Inode& i) const;

  std::unique_ptr<Inode> root_, stats_dir_, stats_file_;
  PathRef root_fd_;
  std::vector<PathRef> layer_roots_;  // [0] is root_fd_
  std::size_t max_open_ = 0;
  // Rank 50 (docs/ARCHITECTURE.md): guards inodes_, placeholders_ and each Inode's parent, name,
  // nlookup, refs, dev, ino and layer. Never held across I/O; only keep_open and rebind
  // take fds_mu_ under it, so that an inode's file and its descriptor change together.
  std::mutex inodes_mu_;
  std::map<std::pair<dev_t, ino_t>, Inode*> inodes_;
  std::map<std::pair<Inode*, std::string>, Inode*> placeholders_;
  // Rank 60: guards open_lru_ and each Inode's fd and lru. A leaf: never held across
  // I/O (descriptors are closed after it is let go); taken alone or under inodes_mu_.
  std::mutex fds_mu_;
  std::list<Inode*> open_lru_;  // most recent first
};

// The path of the file an open descriptor names; empty if it cannot be read.
using neffcache::detail::path_of_fd;
// Opens `rel` (a path, "" for the folder itself) below folder `root_fd` with `flags`,
// through no symbolic link and never out of it (openat2 RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS; a link as the last part is opened itself with O_PATH|O_NOFOLLOW).
neffcache::detail::UniqueFd open_beneath(int root_fd, const std::string& rel, int flags);
// "/proc/self/fd/N": reopens or changes a file by its descriptor.
std::string proc_path(int fd);
// ENOENT in a folder that was removed behind the daemon's back while the kernel still
// knows it (a done entry's name is kept for a day): ESTALE, so the kernel looks the
// folder up again and a system call that walks a path tries once more.
int gone_or(int err, int dir_fd);

}  // namespace neffcachefs
