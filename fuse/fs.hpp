// neffcachefs: a pass-through FUSE file system over a Neuron cache directory that turns
// the open of a missing model.neff (or model.done) in a pending entry into a compile.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <neffcache/s3_tier.hpp>
#include <neffcache/scheduler.hpp>

namespace neffcachefs {

// Threads waiting to take a lock for a client (see Filesystem::setlk).
struct LockWaiters {
  std::mutex mu;
  std::condition_variable idle;
  int running = 0;
  std::atomic<bool> stop{false};
};

struct Options {
  std::string backing;          // absolute path of the backing directory
  // A cache in S3: `backing` is its local tier, filled from S3 as names are asked for,
  // and compiles and fetches go through it (s3_tier.hpp).
  std::shared_ptr<neffcache::S3Tier> tier;
  std::string s3_url;
  neffcache::Scheduler::Options scheduler;
  bool eager = true;            // compile an HLO as soon as it is written through the mount
  bool retry_failed = false;    // failed entries compile again when opened
  std::vector<std::string> default_flags;
  // How long an open may wait for a compile before it fails with EIO (the compile goes
  // on). 0: no deadline of its own; each attempt is still bounded by the compile timeout.
  std::chrono::milliseconds wait_timeout{0};
};

// Numbered EIO sites (greppable in the log, counted in the statistics).
enum class EioSite : int {
  compile_failed = 1,   // the compiler failed (deterministic): model.log recorded
  compile_transient,    // killed, timed out, shut down: the next open tries again
  failed_cached,        // a failure is recorded; open fails at once until retried
  publish_vanished,     // the NEFF was published but could not be opened
  wait_deadline,        // the wait outlasted --wait-timeout; the compile goes on
  count
};

class Filesystem {
 public:
  explicit Filesystem(Options opts);
  ~Filesystem();
  Filesystem(const Filesystem&) = delete;
  Filesystem& operator=(const Filesystem&) = delete;

  // Name of the hidden folder at the mount root that holds stats.json (not in the backing).
  static constexpr const char* k_stats_dir = ".neffcache";
  static constexpr const char* k_stats_file = "stats.json";
  // The counters as JSON, as stats.json shows them.
  std::string stats_json() const;
  // Whether `ino` is one of the mount-only stats inodes (no backing descriptor).
  bool is_special(fuse_ino_t ino) const;
  bool is_stats_file(fuse_ino_t ino) const;

  // The operation table to hand to fuse_session_new; userdata must be this object.
  static const fuse_lowlevel_ops& ops();
  void set_session(fuse_session* se) { session_ = se; }
  // Starts the threads (compile workers, prepare, reap, deadline). After daemonizing:
  // the fork keeps only the thread that calls it.
  void start();
  // Drops queued work, stops running compiles, answers every waiter.
  void shutdown();

  struct Inode;
  struct Waiter;
  struct PathFd;
  using PathRef = std::shared_ptr<const PathFd>;
  struct DirEnt {
    std::string name;
    ino_t ino;
    unsigned char type;
  };
  using Listing = std::vector<DirEnt>;

  // Handlers (public so the C trampolines can reach them).
  void init(fuse_conn_info* conn);
  void lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
  void forget(fuse_ino_t ino, uint64_t n);
  void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
  void readlink(fuse_req_t req, fuse_ino_t ino);
  void mknod_like(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, const char* link_target);
  void unlink(fuse_req_t req, fuse_ino_t parent, const char* name, bool dir);
  void rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent, const char* newname,
              unsigned flags);
  void link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname);
  void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
  void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
  void write(fuse_req_t req, const char* buf, size_t size, off_t off, fuse_file_info* fi);
  void flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void fsync(fuse_req_t req, int datasync, fuse_file_info* fi);
  void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
  void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus);
  void statfs(fuse_req_t req, fuse_ino_t ino);
  void getlk(fuse_req_t req, fuse_file_info* fi, struct flock* lock);
  void setlk(fuse_req_t req, fuse_file_info* fi, struct flock* lock, bool sleep);
  void flock(fuse_req_t req, fuse_file_info* fi, int op);
  void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
  void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
  void setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags);
  void removexattr(fuse_req_t req, fuse_ino_t ino, const char* name);

  // Answers a waiter once (the compile result or an interrupt, whichever comes first).
  void answer(const std::shared_ptr<Waiter>& w, const neffcache::CompileResult* result, int err);

 private:
  Inode& inode(fuse_ino_t ino);
  fuse_ino_t id_of(const Inode* i) const;
  // The inode of `name` in `parent` (one more kernel reference), keeping `path_fd`.
  Inode* intern(Inode& parent, const char* name, int path_fd, const struct stat& st);
  // The inode's O_PATH descriptor, opened again from its parent if it was let go.
  // Null with `err` set when the inode is gone or replaced (ESTALE) or cannot be opened.
  PathRef path_fd(Inode& i, int& err);
  PathRef keep_open(Inode& i, PathRef fd);
  // Under inodes_mu_: drops `nlookup` kernel references, or one of ours when it is 0;
  // inodes no longer referenced are unlisted and appended to `doomed`.
  void unref(Inode* in, uint64_t nlookup, std::vector<Inode*>& doomed);
  void set_parent(Inode* in, Inode& parent, const char* name, std::vector<Inode*>& doomed);
  void destroy(const std::vector<Inode*>& doomed);
  // A folder's names as the mount shows them (placeholders included); null with `err`.
  std::shared_ptr<const Listing> list(Inode& dir, int& err);
  // After a rename through the mount: the inode now at `name` in `parent` is known there.
  void moved(Inode& parent, int parent_fd, const char* name);
  void getattr_of(const Inode& i, struct stat& st) const;
  int reply_entry(fuse_req_t req, Inode& parent, const char* name);
  // Looks `name` up in `parent` (one more kernel reference on success); 0 or an errno.
  int lookup_entry(Inode& parent, const char* name, fuse_entry_param& e);
  bool is_entry_dir(int dir_fd) const;
  std::string path_of(Inode& i);
  std::string name_of(Inode& i);
  void eio(EioSite site, const std::string& what);
  void request_compile(const std::string& entry_dir, neffcache::Priority prio,
                       std::shared_ptr<Waiter> waiter, bool upload_only = false);
  void prepare_loop();
  // Answers the waiters still queued for preparing `entry_dir` with its result, if it is
  // one they would get again: opens that came during a compile wait no longer than it.
  void answer_queued(const std::string& entry_dir, const neffcache::CompileResult& r);
  void track_client_lock(fuse_req_t req, int dir_fd, const char* name);
  // A daemon running as root gives what it creates for a caller to that caller: their
  // files stay theirs, and the NEFFs compiled from their HLOs are theirs too. `fd` is the
  // new file's (any kind of descriptor, O_PATH included), in the folder `dir_fd`.
  void give_to_caller(fuse_req_t req, int dir_fd, int fd);
  void forget_client_lock(int dir_fd, const char* name);
  void reap_loop();
  void deadline_loop();

  Options opts_;
  const bool as_root_ = ::geteuid() == 0;
  fuse_session* session_ = nullptr;
  std::unique_ptr<Inode> root_, stats_dir_, stats_file_;
  PathRef root_fd_;
  struct Counters {
    std::atomic<uint64_t> hits{0};         // opens of a finished model.neff
    std::atomic<uint64_t> misses{0};       // opens that needed a compile (or joined one)
    std::atomic<uint64_t> waiters{0};      // opens waiting for a compile now
    std::atomic<uint64_t> interrupted{0};  // waits ended by an interrupt
    std::atomic<uint64_t> read_bytes{0};   // bytes asked for by reads
  } counters_;
  std::mutex inodes_mu_;  // guards the inode maps below; never held across I/O
  std::map<std::pair<dev_t, ino_t>, Inode*> inodes_;
  std::map<std::pair<Inode*, std::string>, Inode*> placeholders_;
  // Backing descriptors stay open for the most recently used inodes only, so that the
  // kernel may remember far more names than this process may open files.
  std::mutex fds_mu_;  // guards open_lru_ and each Inode's fd; never held across I/O
  std::list<Inode*> open_lru_;  // most recent first
  std::size_t max_open_ = 0;
  std::mutex listings_mu_;
  bool no_opendir_ = false;  // set once in init, before any request
  std::atomic<uint64_t> eio_counts_[static_cast<int>(EioSite::count)] = {};
  std::atomic<bool> told_out_of_fds_{false};  // the EMFILE advice is logged once
  std::unique_ptr<neffcache::Scheduler> scheduler_;

  // Preparing a job reads the whole HLO, so it happens here, never in a handler.
  struct PrepareItem {
    std::string entry_dir;
    neffcache::Priority prio;
    std::shared_ptr<Waiter> waiter;
    bool upload_only = false;  // S3: send the entry's inputs to the bucket, no compile
  };
  std::mutex prep_mu_;
  std::condition_variable prep_cv_;
  std::deque<PrepareItem> prep_queue_;
  bool prep_stop_ = false;
  std::thread prep_thread_;

  // Lock files that unmodified clients created through the mount, held for them with an
  // OFD lock (so other tools see them live) and removed when the creator exits without
  // removing them (so they are never stale for hours).
  struct ClientLock {
    std::string path;
    dev_t dev;
    ino_t ino;
    int pidfd;    // the creating process
    int lock_fd;  // our OFD lock on the file
  };
  // Waiters with a deadline (--wait-timeout), earliest first; answered ones have expired.
  std::mutex deadline_mu_;
  std::condition_variable deadline_cv_;
  std::multimap<std::chrono::steady_clock::time_point, std::weak_ptr<Waiter>> deadlines_;
  bool deadline_stop_ = false;
  std::thread deadline_thread_;

  LockWaiters lock_waiters_;
  std::mutex client_locks_mu_;
  std::vector<ClientLock> client_locks_;
  // Open files (by fh) whose writer was killed while it had them open: their release
  // starts no eager compile of a write that may be cut short.
  std::mutex cut_writes_mu_;
  std::set<uint64_t> cut_writes_;
  // Snapshots of stats.json, one per open (by fh). Owned here, not by the handle: a
  // daemon stopped before the kernel sent an open's RELEASE frees them all the same.
  std::mutex snapshots_mu_;
  std::map<uint64_t, std::string> snapshots_;
  uint64_t next_snapshot_ = 0;
  int reap_wake_fd_ = -1;  // eventfd: the set changed, or stop
  std::atomic<bool> reap_stop_{false};
  std::thread reap_thread_;
};

}  // namespace neffcachefs
