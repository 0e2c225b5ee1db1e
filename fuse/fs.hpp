// neffcachefs: a pass-through FUSE file system over a Neuron cache directory that turns
// the open of a missing model.neff (or model.done) in a pending entry into a compile.
//
// The daemon is made of parts, each owning its state and its mutex:
//   lowlevel.cpp         the ops table and trampolines: the only caller of fuse_reply_*
//   fs.hpp, fs*.cpp      Filesystem: the handlers, which return values or errnos
//   namespace.hpp        what each name is: lookups and listings give typed nodes; the
//                        layers, the remote's fill and the entry view live there
//   inode_table.hpp      inodes, placeholders, the LRU of O_PATH descriptors
//   entry_view.hpp       what a pending, compiling, done or failed entry shows
//   compile_on_open.hpp  requests, the prepare thread, waiters, deadlines, answers
//   client_locks.hpp     lock files of unmodified clients, and their reaper thread
//   lock_forwarding.hpp  getlk/setlk/flock, and the threads of waiting locks
//   stats.hpp            counters, EIO sites, stats.json snapshots
//   input_policy.hpp     what a finished write of an input starts (eager compile, upload)
//   caller.hpp           the caller of a request (its ids, its kept request), its umask
//                        and ownership of what it creates
//
// LOCK ORDER: the table in docs/ARCHITECTURE.md ("The daemon's threads and its lock
// order") is the one statement of it; each mutex says its rank beside its declaration.
// A thread holding a lock takes only locks of a higher rank.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cache_policy.hpp"
#include "caller.hpp"
#include "client_locks.hpp"
#include "compile_on_open.hpp"
#include "indexer.hpp"
#include "inode_table.hpp"
#include "input_policy.hpp"
#include "lock_forwarding.hpp"
#include "namespace.hpp"
#include "options.hpp"
#include "passthrough.hpp"
#include "reply.hpp"
#include "stats.hpp"

namespace neffcachefs {

class Filesystem {
 public:
  explicit Filesystem(Options opts);
  ~Filesystem();
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  // The counters as JSON, as stats.json shows them.
  std::string stats_json() const { return stats_document().dump(2) + "\n"; }
  // `with_opened`: the entries readers got (Stats::opened_entry), a list that may be long.
  nlohmann::ordered_json stats_document(bool with_opened = true) const;
  // Whether `ino` is one of the mount-only stats inodes (no backing descriptor).
  bool is_special(fuse_ino_t ino) const { return inodes_.is_special(ino); }
  bool is_stats_file(fuse_ino_t ino) const { return inodes_.is_stats_file(ino); }

  // The operation table to hand to fuse_session_new; userdata must be this object
  // (defined in lowlevel.cpp).
  static const fuse_lowlevel_ops& ops();
  void set_session(fuse_session* se) {
    session_ = se;
    compile_.set_session(se);
  }
  // Once mounted on `mountpoint` (before the loop): as root, raises the kernel's read-ahead
  // for the mount to what INIT asks for (max_readahead). The kernel takes the smaller of the
  // two, and its own starts at 128 KiB, so a cold read through the page cache made one READ
  // per 128 KiB. Quiet when it cannot (not root).
  static void mounted(const std::string& mountpoint);
  // Starts the threads (compile workers, prepare, reap, deadline). After daemonizing:
  // the fork keeps only the thread that calls it.
  void start();
  // Drops queued work, stops running compiles, answers every waiter.
  void shutdown();

  // What getattr and setattr answer.
  struct Attr {
    struct stat st;
    double timeout;
  };
  // What getxattr and listxattr answer: the size wanted (size 0 asked), or the bytes.
  struct Xattr {
    bool size_only = false;
    std::size_t size = 0;
    std::vector<char> bytes;
  };
  // A name for a listing: false when it did not fit (the listing ends there).
  using AddEntry = std::function<bool(const std::string& name, const fuse_entry_param& e, off_t next, bool plus)>;
  // What create answers.
  struct Created {
    fuse_entry_param entry;
    fuse_file_info fi;
  };

  // Handlers: lowlevel.cpp replies with what they return. The caller is passed where the
  // handler needs its ids, groups or pid, or keeps its request (Deferred). They run
  // without a mount too (tests/fuse/test_handlers.cpp).
  void init(fuse_conn_info* conn);
  Answer<fuse_entry_param> lookup(fuse_ino_t parent, const char* name);
  void forget(fuse_ino_t ino, uint64_t n) { inodes_.forget(ino, n); }
  Answer<Attr> getattr(fuse_ino_t ino, fuse_file_info* fi);
  Answer<Attr> setattr(fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
  Answer<std::string> readlink(fuse_ino_t ino);
  Answer<fuse_entry_param> mknod_like(const Caller& caller, fuse_ino_t parent, const char* name, mode_t mode,
                                      const char* link_target);
  int unlink(fuse_ino_t parent, const char* name, bool dir);
  int rename(fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname, unsigned flags);
  Answer<fuse_entry_param> link(fuse_ino_t ino, fuse_ino_t newparent, const char* newname);
  Answer<fuse_file_info> open(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi);
  Answer<Created> create(const Caller& caller, fuse_ino_t parent, const char* name, mode_t mode, const fuse_file_info& fi);
  // stats.json's bytes, or (nullopt) a read of the backing descriptor fi.fh.
  std::optional<std::string> read_special(fuse_ino_t ino, size_t size, off_t off, const fuse_file_info& fi);
  Answer<size_t> write(const char* buf, size_t size, off_t off, const fuse_file_info& fi);
  // stats.json has no backing descriptor: nothing to flush or sync (0), nor to lock
  // (ENOLCK).
  int flush(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi);
  int release(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi);
  // An open or create whose answer did not reach the kernel: its descriptor (or stats.json's
  // snapshot) closed, and no longer counted (no release will come).
  void not_opened(fuse_ino_t ino, const fuse_file_info& fi);
  // A create whose answer did not reach the kernel: not opened, and the kernel's reference
  // to its inode given back (the kernel never took it).
  void not_created(const Created& c) {
    not_opened(c.entry.ino, c.fi);
    forget(c.entry.ino, 1);
  }
  int fsync(fuse_ino_t ino, int datasync, const fuse_file_info& fi);
  // On the backing descriptors, as the disk under them answers (stats.json has none: EOPNOTSUPP,
  // and the kernel copies a copy_file_range from it by reading).
  int fallocate(fuse_ino_t ino, int mode, off_t off, off_t len, const fuse_file_info& fi);
  Answer<size_t> copy_file_range(fuse_ino_t in, off_t in_off, const fuse_file_info& in_fi, fuse_ino_t out,
                                 off_t out_off, const fuse_file_info& out_fi, size_t len, int flags);
  Answer<off_t> lseek(fuse_ino_t ino, off_t off, int whence, const fuse_file_info& fi);
  Answer<fuse_file_info> opendir(fuse_ino_t ino, const fuse_file_info& fi);
  // Adds names from offset `off` until `add` says one did not fit; 0 or an errno.
  int readdir(fuse_ino_t ino, off_t off, bool plus, const AddEntry& add);
  Answer<struct statvfs> statfs(fuse_ino_t ino);
  Answer<Xattr> getxattr(fuse_ino_t ino, const char* name, size_t size);
  Answer<Xattr> listxattr(fuse_ino_t ino, size_t size);
  int setxattr(fuse_ino_t ino, const char* name, const char* value, size_t size, int flags);
  int removexattr(fuse_ino_t ino, const char* name);
  // POSIX locks through the mount: forwarded (lock_forwarding.hpp).
  Answer<struct flock> getlk(fuse_ino_t ino, const fuse_file_info& fi, const struct flock& lock);
  Answer<Ok> setlk(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi, const struct flock& lock, bool sleep);
  // flock(2) through the mount: forwarded (lock_forwarding.hpp). An LNL key's lock in the
  // root of a mount whose writes go elsewhere (a bucket) is held there too, for the client
  // that compiles the key (store::Remote::hold_key_for_client), until it lets go.
  Answer<Ok> flock(const Caller& caller, fuse_ino_t ino, const fuse_file_info& fi, int op);

 private:
  void getattr_of(const Inode& i, struct stat& st) const;
  // What the kernel gets of a node: its attributes and how long it may keep them.
  fuse_entry_param entry_of(const Node& n) const;
  // Looks `name` up in `parent` (one more kernel reference on success).
  Answer<fuse_entry_param> lookup_entry(Inode& parent, const char* name);
  // A client of this host creates its lock file `name` in the entry folder `dir_fd`: the
  // entry is held elsewhere for it first (store::Remote::hold_for_client); says once in
  // the log when that cannot be asked.
  neffcache::ClientHold hold_for_client(int dir_fd, const char* name);
  // Says once in the log that a client's lock `name` holds on this host only (`held`).
  neffcache::ClientHold told(neffcache::ClientHold held, std::string_view name);
  // The open `fh` let go of an LNL key's lock it held elsewhere too (flock): what was
  // held is given back, after the key's entry is published if it is done.
  void let_go_of_key(uint64_t fh);
  // The key's entry folder that the open `fh` holds (flock), no longer noted as held.
  std::optional<std::string> take_key_hold(uint64_t fh);
  // The lock file `name` could not be made (`err`): what hold_for_client took for it
  // (`held`) is given back. The errno to answer.
  int lock_not_made(neffcache::ClientHold::Kind held, int dir_fd, const char* name, int err);
  // The open of another host's lock shown here (namespace.hpp): the client takes the lock
  // as on a disk where the file exists, so the file is made for it now.
  Answer<fuse_file_info> open_shown_lock(const Caller& caller, Inode& i, const fuse_file_info& fi);
  // An open of `i` (`ino`) that writes it (`flags`) is answered, or it was truncated: the
  // content index forgets a done entry's NEFF, and a writer (an open to write) makes it
  // no longer finished while it lasts and the kernel drop what it kept. (Its release
  // takes it back.)
  void changing(fuse_ino_t ino, Inode& i, int flags);
  // Starts what a finished input calls for in `entry_dir`.
  void act(InputAction action, const std::string& entry_dir);
  // A job of the entry folder `entry_dir` ended: the kernel forgets what it keeps of the
  // folders it may have changed behind the kernel's back (the entry; an LNL key's root,
  // which holds its lock and holder files), so that no listing outlives what it shows.
  void entry_changed(const std::string& entry_dir);
  // Before the folder `name` of `from_dir` is renamed to the LNL key `newname` in the
  // root (`to_dir`) of a tier: publishes it through the store; 0, or the rename's errno.
  int promote(int from_dir, const char* name, int to_dir, const char* newname, unsigned flags);

  Options opts_;
  const bool as_root_ = ::geteuid() == 0;
  Stats stats_;
  Namespace ns_;
  InodeTable& inodes_ = ns_.inodes();
  InputPolicy inputs_;
  CompileOnOpen compile_;
  ClientLocks client_locks_;
  LockForwarding locks_;
  Indexer indexer_;
  Passthrough passthrough_;
  bool no_opendir_ = false;  // set once in init, before any request
  fuse_session* session_ = nullptr;  // set once, before the loop starts
  std::atomic<bool> stopped_{false};
  std::atomic<bool> told_lock_here_only_{false};  // hold_for_client's fallback is logged once
  // Rank 85 (docs/ARCHITECTURE.md): guards key_holds_. A leaf.
  std::mutex key_holds_mu_;
  std::map<uint64_t, std::string> key_holds_;  // open -> the LNL key's entry folder it holds (flock)
};

}  // namespace neffcachefs
