// The namespace: what each name of the mount is. Lookups and listings ask here and get a
// node; the handlers act on nodes and ask here before they make, change or remove a name.
// It owns what decides a name (as mountpoint-s3's superblock does for its handlers):
//   - the inode table (inode_table.hpp);
//   - the layers (layers.hpp): the first layer that has a name, whiteouts, opaque folders,
//     copies up into layer 0; no handler asks whether the mount has layers;
//   - the remote's fill: a name or a folder missing here is asked of the store's remote
//     (an S3 tier fetches it) before it is judged missing;
//   - the entry view (entry_view.hpp): a pending entry's placeholders, a done entry's
//     files, which never change (NodeKind::finished);
//   - the mount's own folder of counters (stats.hpp), and the listings the kernel reads.
// A node's kind is all the cache policy (cache_policy.hpp) needs.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "cache_policy.hpp"
#include "entry_view.hpp"
#include "inode_table.hpp"
#include "options.hpp"
#include "reply.hpp"

namespace neffcachefs {

// A name looked up: its inode (one more kernel reference; its layer is the inode's), what
// it is, and its attributes (zero for the special files, which their owner fills).
struct Node {
  Inode* inode = nullptr;
  NodeKind kind = NodeKind::plain;
  struct stat attr {};
};

class Namespace {
 public:
  explicit Namespace(const Options& opts);

  InodeTable& inodes() { return inodes_; }
  // Mount-wide: whether names come from more than one layer (listings then change with
  // folders whose changes the kernel does not see: cache_policy.hpp).
  bool layered() const { return inodes_.layers() > 1; }
  // What an inode is to the kernel's caches.
  static NodeKind kind_of(const Inode& i) {
    if (i.special != Inode::Special::none) return NodeKind::special;
    if (i.placeholder) return NodeKind::placeholder;
    return i.finished ? NodeKind::finished : NodeKind::plain;
  }

  // The node of `name` in folder `parent`: a backing file of the first layer that has it
  // (asked of the remote first when missing), a placeholder of a pending entry, or one of
  // the mount's counters. Removes the stale lock of an entry folder it finds.
  Answer<Node> lookup(Inode& parent, const char* name);
  // The listing of folder `dir` that a read at offset `off` continues (a new one at 0, or
  // when none is kept); null with `err`. Kept until done_listing.
  std::shared_ptr<const Listing> listing(Inode& dir, off_t off, int& err);
  // The kernel read `h` to its end: it is let go.
  void done_listing(Inode& dir, const std::shared_ptr<const Listing>& h);

  // Before `name` is made in `parent`: 0; EPERM for the layers' own names; EROFS for all
  // but lock files over a read-only cache; EEXIST when a layer shows it (a lower layer
  // only, for a create that opens what layer 0 has).
  enum class Existing { refused, opened };
  int may_make(Inode& parent, const char* name, Existing existing = Existing::refused);
  // Layer 0's copy of folder `dir`, where names are made (copied up first when it has
  // none); null with `err`.
  PathRef upper_dir(Inode& dir, int& err);
  // Whether a folder made as `name` in `dir` (layer 0's copy of `parent`) must be opaque:
  // made over a whiteout, it hides what the layers below have under that name.
  bool new_folder_opaque(Inode& parent, int dir, const char* name);
  // mkdirat of `name` in `dir` as an opaque folder: 0, or -1 with errno.
  static int make_opaque_dir(int dir, const char* name, mode_t mode);
  // After `name` was made or renamed into `dir` (layer 0's copy): it shadows the lower
  // name now, so its whiteout goes.
  void made(int dir, const char* name);
  // Before a change of inode `i` (its data, attributes, extended attributes): 0 once it is
  // in layer 0, EROFS where the mount may not write it.
  int writable(Inode& i);
  // Before the bytes of `i` (its file's attributes `st`) change (an open that writes or
  // truncates it, a truncate): a NEFF that other entries share (our twins are hard links:
  // compile/twin.hpp) answers ESTALE, and the kernel's second look at the name gives it a
  // file of its own, so that no other entry changes. 0, ESTALE, or why the last split
  // failed (once).
  int own_content(Inode& i, const struct stat& st);
  // The last open that wrote `i` ended: it is finished again if a lookup would find it so.
  void written(Inode& i);
  // Before a hard link of `i` is made as `name` in `parent`: may_make's answers, and EXDEV
  // for a file of a lower layer (checked after the name's rule, before its existence).
  int may_link(Inode& i, Inode& parent, const char* name);

  // Removes `name` from `parent` (over layers: from layer 0, with a whiteout when a lower
  // layer shows it); `forget(dir_fd)` runs before the unlink of a file. 0 or an errno.
  int remove(Inode& parent, const char* name, bool dir, const std::function<void(int dir_fd)>& forget);
  // Whether `name` in `parent` is a placeholder (no file behind it): a pending entry's
  // product, or the lock file of an entry another host holds.
  bool is_placeholder(Inode& parent, const char* name);
  // The attributes of the placeholder `name` in `parent`, whose backing folder is `dir_fd`
  // (entry_view.hpp: those of the product it stands for, size 0), nullopt when it is none
  // (any longer).
  std::optional<struct stat> placeholder_attr(Inode& parent, int dir_fd, const std::string& name);
  // Called with an entry's folder when a look finds our own publish interrupted there
  // (entry_view.hpp, stage unfinished): the daemon finishes it off the handler threads.
  // Set once, before the first request.
  void when_unfinished(std::function<void(const std::string& entry_dir)> f) { unfinished_ = std::move(f); }
  // Before a rename: checks it over the layers (EXDEV for what a lower layer has) and
  // makes the whiteout and opaque marker it needs; `pfd`, `npfd`: layer 0's copies of both
  // folders (made here over layers). 0 or an errno.
  int prepare_rename(Inode& p, const char* name, Inode& np, const char* newname, unsigned flags, PathRef& pfd,
                     PathRef& npfd);

 private:
  // The path below the root of `name` in `folder`.
  std::string rel_of(Inode& folder, const char* name);
  struct Found {
    PathRef dir;                     // the folder it was found in (or the topmost copy, when not found)
    neffcache::detail::UniqueFd fd;  // O_PATH
    int layer = 0;
  };
  // Finds `name` in folder `parent`: in that folder itself with one layer or in an entry,
  // else in the first layer whose copy of it has the name; 0, or ENOENT when no layer has
  // it or a whiteout hides it, or another errno.
  int find(Inode& parent, const char* name, Found& found);
  Answer<Node> lookup_backing(Inode& parent, const char* name);
  // What the file or folder `name` (of type `mode`) of folder `folder` is to the entry
  // view, `entry_fd` being the entry's folder (the folder `name` itself, or the one it is
  // in): in a done entry, its NEFF, and whether the kernel may keep it (NodeKind::finished).
  struct Seen {
    bool done = false, neff = false, kept = false;
  };
  Seen seen_as(int entry_fd, const std::string& folder, const char* name, mode_t mode);
  // The attributes of the lock file `name` of the entry folder `dir_fd` while another host
  // holds the entry (store::Remote::held_elsewhere), nullopt when none does.
  std::optional<struct stat> shown_lock_attr(int dir_fd, const char* name);
  // Whether the daemon may finish a publish in the folder `folder` (entry_view.hpp): it is
  // in layer 0, and the mount is no scratch folder over a read-only cache.
  bool may_finish(Inode& folder);
  // may_make's parts: the rule for a name, and whether a layer has it (EEXIST).
  int may_name(const char* name) const;
  int exists(Inode& parent, const char* name, Existing existing);
  // Whether a layer under layer 0 shows `name` in folder `parent`: its removal from layer
  // 0 needs a whiteout.
  bool below(Inode& parent, const char* name);
  // Copies inode `i` up into layer 0 if it is in a lower layer (the whole entry for an
  // entry or a file of one); 0 or an errno.
  int copy_up(Inode& i);
  // A folder's names as the mount shows them (placeholders included); null with `err`.
  std::shared_ptr<const Listing> list(Inode& dir, int& err);
  // The names of the folder `dir` merged over the layers.
  std::shared_ptr<const Listing> list_merged(Inode& dir, int& err);
  // Whether the folder `rel` shows no names in any layer (whiteouts applied).
  bool merged_empty(const std::string& rel);
  // own_content's second half, at the lookup of `name` (in `parent`, open as `dir_fd`),
  // which found `n`, the shared inode: the name holds a copy of its own now, and `n` is its
  // node (the kernel's reference moved from the shared inode). When no copy could be made,
  // `n` stays and the shared inode keeps why (Inode::unshare_error). An errno when the name
  // holds the copy but it cannot be answered (the lookup fails: never the shared inode).
  int unshared(Inode& parent, int dir_fd, const char* name, Node& n);
  int remove_layered(Inode& parent, const char* name, bool dir, const std::function<void(int dir_fd)>& forget);
  int rename_layered(Inode& p, const char* name, Inode& np, const char* newname, unsigned flags, PathRef& pfd,
                     PathRef& npfd);

  const Options& opts_;
  const bool as_root_ = ::geteuid() == 0;
  // The daemon's umask, read at its start: what a published product's mode loses, and so
  // a placeholder's.
  const mode_t umask_;
  InodeTable inodes_;
  std::atomic<bool> told_out_of_fds_{false};  // the EMFILE advice is logged once
  std::function<void(const std::string&)> unfinished_;
  // Rank 40: guards each Inode's listing. A leaf.
  std::mutex listings_mu_;
};

}  // namespace neffcachefs
