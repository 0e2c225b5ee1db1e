// neffcachefs handlers. Design notes:
// - Inodes are backing files keyed by (st_dev, st_ino), as in libfuse's passthrough_hp,
//   but an inode does not pin a descriptor: it knows its parent and name, and its O_PATH
//   descriptor is kept open only while it is among the most recently used (half the
//   descriptor limit). A walk of a large cache makes the kernel remember more names
//   than a process may open files. Reopening checks (st_dev, st_ino): a name that now
//   holds another file answers ESTALE, and the kernel looks the name up again.
// - Lookups never follow symlinks and take one name at a time, so nothing outside the
//   backing directory is reachable through the mount.
// - In a pending entry, model.neff and model.done are placeholders: listed, stat-able
//   (size 0, no caching), and opening one submits the entry's compile and keeps the
//   request; the reply comes from the scheduler's callback, so no handler thread waits.
// - Kernel notifications are sent only from scheduler or preparer threads, never from
//   inside a handler (libfuse documents that as a deadlock).
#include "fs.hpp"

#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <utility>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include <neffcache/detail/fs.hpp>
#include <neffcache/layout.hpp>
#include <neffcache/lock.hpp>
#include <neffcache/maintenance.hpp>

namespace neffcachefs {

using namespace neffcache;
static_assert(sizeof(fuse_ino_t) >= sizeof(void*), "inode numbers carry pointers");

// How long the kernel may cache names and attributes. The files of a done entry never
// change (a publish renames new inodes into place), so their names and attributes may be
// cached for a day; everything else briefly, since other processes change the backing
// directory too; placeholders not at all. Should a done entry be removed or repaired
// behind the daemon's back, opening a cached name finds its file unlinked and answers
// ESTALE, so the kernel looks it up again.
constexpr double k_timeout = 1.0;
constexpr double k_immutable_timeout = 86400.0;
// With an S3 cache: scheduler workers beyond the compile slots, for fetches.
constexpr int k_fetch_lanes = 4;

// An open O_PATH descriptor, closed when its last user lets go of it.
struct Filesystem::PathFd {
  int fd;
  explicit PathFd(int f) : fd(f) {}
  PathFd(const PathFd&) = delete;
  PathFd& operator=(const PathFd&) = delete;
  ~PathFd() { ::close(fd); }
};

struct Filesystem::Inode {
  enum class Special { none, stats_dir, stats_file };
  Special special = Special::none;
  dev_t dev = 0;
  ino_t ino = 0;
  bool placeholder = false;  // model.neff or model.done of a pending entry
  // A file of a done entry (seen so by a lookup): its content never changes, so its
  // pages may stay cached across opens. finished_neff: its model.neff (opens are hits).
  std::atomic<bool> finished{false};
  std::atomic<bool> finished_neff{false};
  // Guarded by inodes_mu_ (a placeholder's never change): where the inode was last
  // seen, which is how its descriptor is opened again.
  Inode* parent = nullptr;
  std::string name;
  uint64_t nlookup = 0;  // the kernel's references
  uint64_t refs = 0;     // ours: inodes whose parent this is, and reopens under way
  // Guarded by fds_mu_: the descriptor while the inode is in open_lru_.
  PathRef fd;
  std::list<Inode*>::iterator lru;
  // Guarded by listings_mu_: a folder's listing while the kernel reads it.
  std::shared_ptr<const Listing> listing;
};

struct Filesystem::Waiter {
  fuse_req_t req;
  fuse_ino_t ino;
  fuse_ino_t parent;
  std::string name;
  std::string entry;  // the entry folder's path, for the log
  int parent_fd;  // owned
  fuse_file_info fi;
  std::atomic<bool> answered{false};
  ~Waiter() { ::close(parent_fd); }
};

namespace {

Filesystem& self(fuse_req_t req) { return *static_cast<Filesystem*>(fuse_req_userdata(req)); }

std::string proc_path(int fd) { return fmt::format("/proc/self/fd/{}", fd); }

// The path of the file an open descriptor names; empty if it cannot be read.
std::string path_of_fd(int fd) {
  char buf[PATH_MAX];
  ssize_t n = ::readlink(proc_path(fd).c_str(), buf, sizeof buf);
  return n > 0 && n < static_cast<ssize_t>(sizeof buf) ? std::string(buf, static_cast<std::size_t>(n)) : std::string();
}

bool is_hlo_name(std::string_view n) { return n == k_hlo_module_file || n == k_hlo_legacy_file; }

bool is_product_name(std::string_view n) { return n == k_neff_file || n == k_done_file; }

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

// Whether thread `tid` is ending by a signal: exiting (PF_EXITING in the flags of
// /proc/TID/stat, field 9) with a signal as its exit code (field 52). The kernel sends
// the FLUSH of each file a process had open in the context of its exiting thread, so
// this tells a client killed in the middle of a write from one that closed the file.
bool killed_while_exiting(pid_t tid) {
  constexpr unsigned long k_pf_exiting = 0x4;
  auto fields = tid > 0 ? detail::proc_stat_fields(tid) : std::nullopt;
  if (!fields || fields->size() < 52 - 2) return false;  // exit_code is shown to whoever may trace it
  auto number = [&](int field) { return std::strtoul((*fields)[static_cast<std::size_t>(field - 3)].c_str(), nullptr, 10); };
  return (number(9) & k_pf_exiting) && (number(52) & 0x7f) != 0;
}

// ENOENT in a folder that was removed behind the daemon's back while the kernel still
// knows it (a done entry's name is kept for a day): ESTALE, so the kernel looks the
// folder up again and a system call that walks a path tries once more.
int gone_or(int err, int dir_fd) {
  struct stat st {};
  return err == ENOENT && ::fstat(dir_fd, &st) == 0 && st.st_nlink == 0 ? ESTALE : err;
}

// The mode of a create, mkdir or mknod arrives with the caller's umask already applied
// by the kernel, so the daemon must apply none of its own to it. A umask belongs to the
// fs_struct that a process's threads share, so a request thread takes one of its own
// (once), and sets its umask to 0 only for the scope of a client's create: whatever else
// the daemon creates (tier folders, published NEFFs) gets the daemon's umask.
class CallersMode {
 public:
  CallersMode() {
    if (own_umask()) old_ = ::umask(0);
  }
  ~CallersMode() {
    if (old_) ::umask(*old_);
  }
  CallersMode(const CallersMode&) = delete;
  CallersMode& operator=(const CallersMode&) = delete;

 private:
  static bool own_umask() {
    thread_local const bool own = [] {
      if (::unshare(CLONE_FS) == 0) return true;
      static std::atomic<bool> told{false};
      if (!told.exchange(true))
        fmt::print(stderr, "neffcachefs: warning: a request thread cannot take a umask of its own ({}); "
                           "files created through the mount get the daemon's umask as well\n", std::strerror(errno));
      return false;
    }();
    return own;
  }
  std::optional<mode_t> old_;
};

// Whether the caller of `req` is in group `gid` (its own or a supplementary one).
bool caller_in_group(fuse_req_t req, gid_t gid) {
  if (fuse_req_ctx(req)->gid == gid) return true;
  std::vector<gid_t> groups(64);
  int n = fuse_req_getgroups(req, static_cast<int>(groups.size()), groups.data());
  if (n > static_cast<int>(groups.size())) {  // it says how many there are
    groups.resize(static_cast<std::size_t>(n));
    n = fuse_req_getgroups(req, n, groups.data());
  }
  if (n <= 0) return false;
  groups.resize(std::min(groups.size(), static_cast<std::size_t>(n)));
  return std::find(groups.begin(), groups.end(), gid) != groups.end();
}


}  // namespace

Filesystem::Filesystem(Options opts) : opts_(std::move(opts)) {
  root_ = std::make_unique<Inode>();
  root_fd_ = std::make_shared<PathFd>(::open(opts_.backing.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC));
  struct stat st {};
  ::fstat(root_fd_->fd, &st);
  root_->dev = st.st_dev;
  root_->ino = st.st_ino;
  root_->nlookup = 2;
  stats_dir_ = std::make_unique<Inode>();
  stats_dir_->special = Inode::Special::stats_dir;
  stats_file_ = std::make_unique<Inode>();
  stats_file_->special = Inode::Special::stats_file;
  // Half the descriptors for inodes; the rest for open files, compiles and locks.
  struct rlimit rl {};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  max_open_ = std::max<std::size_t>(64, static_cast<std::size_t>(std::min<rlim_t>(rl.rlim_cur, 1 << 21) / 2));
  opts_.scheduler.settings.retry_failed = opts_.retry_failed;
  opts_.scheduler.settings.default_flags = opts_.default_flags;
  reap_wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

void Filesystem::start() {
  Scheduler::Options so = opts_.scheduler;
  if (opts_.tier) {
    // Compiles take the tier's slots (as many as --jobs); the extra workers fetch done
    // entries and wait on other hosts' leases meanwhile.
    so.jobs += k_fetch_lanes;
    so.compile = [tier = opts_.tier](const std::string& entry, const CompileSettings& s) { return tier->settle(entry, s); };
  }
  scheduler_ = std::make_unique<Scheduler>(so);
  prep_thread_ = std::thread([this] { prepare_loop(); });
  reap_thread_ = std::thread([this] { reap_loop(); });
  if (opts_.wait_timeout.count() > 0) deadline_thread_ = std::thread([this] { deadline_loop(); });
}

Filesystem::~Filesystem() {
  shutdown();
  // The kernel sends no FORGET for what it still remembers at unmount.
  std::lock_guard lk(inodes_mu_);
  open_lru_.clear();
  for (auto& [key, in] : inodes_) delete in;
  for (auto& [key, in] : placeholders_) delete in;
  inodes_.clear();
  placeholders_.clear();
}

void Filesystem::shutdown() {
  {
    std::lock_guard lk(prep_mu_);
    if (prep_stop_) return;
    prep_stop_ = true;
  }
  prep_cv_.notify_all();
  if (prep_thread_.joinable()) prep_thread_.join();
  {
    std::lock_guard lk(deadline_mu_);
    deadline_stop_ = true;
  }
  deadline_cv_.notify_all();
  if (deadline_thread_.joinable()) deadline_thread_.join();
  // Work never handed to the scheduler still has waiters to answer.
  for (auto& item : prep_queue_)
    if (item.waiter) answer(item.waiter, nullptr, EIO);
  prep_queue_.clear();
  if (scheduler_) scheduler_->shutdown();
  {
    // Lock waits end with EINTR while the session can still carry the replies.
    std::unique_lock lk(lock_waiters_.mu);
    lock_waiters_.stop = true;
    lock_waiters_.idle.wait(lk, [&] { return lock_waiters_.running == 0; });
  }
  reap_stop_ = true;
  uint64_t one = 1;
  (void)!::write(reap_wake_fd_, &one, sizeof one);
  if (reap_thread_.joinable()) reap_thread_.join();
  // Clients that are still alive keep their lock files; only our holds end.
  for (auto& l : client_locks_) ::close(l.pidfd), ::close(l.lock_fd);
  client_locks_.clear();
  ::close(reap_wake_fd_);
}

void Filesystem::track_client_lock(fuse_req_t req, int dir_fd, const char* name) {
  std::string_view n = name;
  if (!n.ends_with(k_lock_suffix) || !is_hlo_name(n.substr(0, n.size() - k_lock_suffix.size()))) return;
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, fuse_req_ctx(req)->pid, 0));
  int lock_fd = ::openat(dir_fd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
  struct stat st {};
  struct flock fl {};
  fl.l_type = F_WRLCK;
  fl.l_whence = SEEK_SET;
  if (lock_fd < 0 || ::fstat(lock_fd, &st) != 0 || ::fcntl(lock_fd, F_OFD_SETLK, &fl) != 0) {
    if (pidfd >= 0) ::close(pidfd);
    if (lock_fd >= 0) ::close(lock_fd);
    return;
  }
  std::string dir = path_of_fd(dir_fd);
  std::string path = dir.empty() ? "" : fmt::format("{}/{}", dir, name);
  {
    std::lock_guard lk(client_locks_mu_);
    // pidfd < 0: the creator is already gone; the reaper removes the file at once.
    client_locks_.push_back({path, st.st_dev, st.st_ino, pidfd, lock_fd});
  }
  uint64_t one = 1;
  (void)!::write(reap_wake_fd_, &one, sizeof one);
}

void Filesystem::forget_client_lock(int dir_fd, const char* name) {
  struct stat st {};
  if (::fstatat(dir_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  std::lock_guard lk(client_locks_mu_);
  for (auto it = client_locks_.begin(); it != client_locks_.end(); ++it)
    if (it->dev == st.st_dev && it->ino == st.st_ino) {
      ::close(it->pidfd);
      ::close(it->lock_fd);
      client_locks_.erase(it);
      return;
    }
}

void Filesystem::reap_loop() {
  while (!reap_stop_) {
    std::vector<pollfd> fds{{reap_wake_fd_, POLLIN, 0}};
    {
      std::lock_guard lk(client_locks_mu_);
      for (const auto& l : client_locks_) fds.push_back({l.pidfd, POLLIN, 0});
    }
    ::poll(fds.data(), fds.size(), -1);
    uint64_t drained;
    (void)!::read(reap_wake_fd_, &drained, sizeof drained);
    std::lock_guard lk(client_locks_mu_);
    for (auto it = client_locks_.begin(); it != client_locks_.end();) {
      pollfd probe{it->pidfd, POLLIN, 0};
      bool exited = it->pidfd < 0 || (::poll(&probe, 1, 0) == 1);
      if (!exited) {
        ++it;
        continue;
      }
      // The creator died holding its lock: remove the file if it is still that lock.
      struct stat st {};
      if (!it->path.empty() && ::lstat(it->path.c_str(), &st) == 0 && st.st_dev == it->dev && st.st_ino == it->ino) {
        ::unlink(it->path.c_str());
        fmt::print(stderr, "neffcachefs: removed {}: its creator exited without removing it\n", it->path);
      }
      if (it->pidfd >= 0) ::close(it->pidfd);
      ::close(it->lock_fd);
      it = client_locks_.erase(it);
    }
  }
}

void Filesystem::deadline_loop() {
  std::unique_lock lk(deadline_mu_);
  while (!deadline_stop_) {
    if (deadlines_.empty()) {
      deadline_cv_.wait(lk);
      continue;
    }
    auto first = deadlines_.begin();
    if (first->first > std::chrono::steady_clock::now()) {
      deadline_cv_.wait_until(lk, first->first);
      continue;
    }
    auto w = first->second.lock();  // empty: answered and released meanwhile
    deadlines_.erase(first);
    if (!w) continue;
    lk.unlock();
    answer(w, nullptr, ETIMEDOUT);
    lk.lock();
  }
}

// By inode number alone: the hot paths (read, flush, locks) need not touch an Inode
// that a FORGET on another thread may free once the kernel is done with it. (The kernel
// orders the two, but no sanitizer can see that.)
bool Filesystem::is_special(fuse_ino_t ino) const { return is_stats_file(ino) || ino == reinterpret_cast<fuse_ino_t>(stats_dir_.get()); }

bool Filesystem::is_stats_file(fuse_ino_t ino) const { return ino == reinterpret_cast<fuse_ino_t>(stats_file_.get()); }

Filesystem::Inode& Filesystem::inode(fuse_ino_t ino) {
  return ino == FUSE_ROOT_ID ? *root_ : *reinterpret_cast<Inode*>(ino);
}

fuse_ino_t Filesystem::id_of(const Inode* i) const {
  return i == root_.get() ? FUSE_ROOT_ID : reinterpret_cast<fuse_ino_t>(i);
}

std::string Filesystem::name_of(Inode& i) {
  std::lock_guard lk(inodes_mu_);  // a rename may change it
  return i.name;
}

std::string Filesystem::path_of(Inode& i) {
  int err = 0;
  PathRef fd = path_fd(i, err);
  return fd ? path_of_fd(fd->fd) : std::string();
}

Filesystem::PathRef Filesystem::keep_open(Inode& i, PathRef fd) {
  std::vector<PathRef> closing;  // closed after the lock is let go
  std::lock_guard lk(fds_mu_);
  if (i.fd) {  // opened by another request meanwhile
    open_lru_.splice(open_lru_.begin(), open_lru_, i.lru);
    closing.push_back(std::move(fd));
    return i.fd;
  }
  i.fd = fd;
  open_lru_.push_front(&i);
  i.lru = open_lru_.begin();
  while (open_lru_.size() > max_open_) {
    Inode* victim = open_lru_.back();
    open_lru_.pop_back();
    closing.push_back(std::move(victim->fd));  // requests using it keep it open
    victim->fd.reset();
  }
  return fd;
}

Filesystem::PathRef Filesystem::path_fd(Inode& i, int& err) {
  if (&i == root_.get()) return root_fd_;
  if (i.placeholder || i.special != Inode::Special::none) {
    err = ENOENT;
    return nullptr;
  }
  {
    std::lock_guard lk(fds_mu_);
    if (i.fd) {
      open_lru_.splice(open_lru_.begin(), open_lru_, i.lru);
      return i.fd;
    }
  }
  Inode* parent;
  std::string name;
  {
    std::lock_guard lk(inodes_mu_);
    parent = i.parent;
    name = i.name;
    ++parent->refs;  // a rename meanwhile must not free it under us
  }
  PathRef result;
  if (PathRef dir = path_fd(*parent, err)) {
    int fd = ::openat(dir->fd, name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC);
    struct stat st {};
    if (fd >= 0 && ::fstat(fd, &st) == 0 && st.st_dev == i.dev && st.st_ino == i.ino) {
      result = keep_open(i, std::make_shared<PathFd>(fd));
    } else {
      // Gone or replaced by another process: the kernel looks the name up again.
      err = fd < 0 && errno != ENOENT && errno != ENOTDIR ? errno : ESTALE;
      if (fd >= 0) ::close(fd);
    }
  }
  std::vector<Inode*> doomed;
  {
    std::lock_guard lk(inodes_mu_);
    unref(parent, 0, doomed);
  }
  destroy(doomed);
  return result;
}

void Filesystem::unref(Inode* in, uint64_t nlookup, std::vector<Inode*>& doomed) {
  while (in && in != root_.get()) {
    if (nlookup) in->nlookup -= std::min(nlookup, in->nlookup);
    else --in->refs;
    if (in->nlookup || in->refs) return;
    if (in->placeholder) placeholders_.erase({in->parent, in->name});
    else inodes_.erase({in->dev, in->ino});
    doomed.push_back(in);
    in = in->parent;  // held a reference for this one
    nlookup = 0;
  }
}

void Filesystem::set_parent(Inode* in, Inode& parent, const char* name, std::vector<Inode*>& doomed) {
  if (in->parent == &parent && in->name == name) return;
  ++parent.refs;
  Inode* old = std::exchange(in->parent, &parent);
  in->name = name;
  if (old) unref(old, 0, doomed);
}

void Filesystem::destroy(const std::vector<Inode*>& doomed) {
  if (doomed.empty()) return;
  std::vector<PathRef> closing;  // closed after the lock is let go
  {
    std::lock_guard lk(fds_mu_);
    for (Inode* in : doomed)
      if (in->fd) {
        open_lru_.erase(in->lru);
        closing.push_back(std::move(in->fd));
      }
  }
  for (Inode* in : doomed) delete in;
}

void Filesystem::moved(Inode& parent, int parent_fd, const char* name) {
  struct stat st {};
  if (::fstatat(parent_fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0) return;
  std::vector<Inode*> doomed;
  {
    std::lock_guard lk(inodes_mu_);
    auto it = inodes_.find({st.st_dev, st.st_ino});
    if (it != inodes_.end()) set_parent(it->second, parent, name, doomed);
  }
  destroy(doomed);
}

void Filesystem::eio(EioSite site, const std::string& what) {
  ++eio_counts_[static_cast<int>(site)];
  fmt::print(stderr, "neffcachefs: EIO ({:02}) {}\n", static_cast<int>(site), what);
}

std::string Filesystem::stats_json() const {
  auto p = scheduler_->progress();
  nlohmann::ordered_json eio;
  for (int site = 1; site < static_cast<int>(EioSite::count); ++site)
    eio[fmt::format("{:02}", site)] = eio_counts_[site].load();
  nlohmann::ordered_json j{
      {"hits", counters_.hits.load()},
      {"misses", counters_.misses.load()},
      {"waiters", counters_.waiters.load()},
      {"interrupted", counters_.interrupted.load()},
      {"read_bytes", counters_.read_bytes.load()},
      {"compiles", {{"started", p.compiles_started}, {"succeeded", p.compiles_succeeded},
                    {"failed", p.compiles_failed}, {"transient", p.compiles_transient},
                    {"seconds", p.compile_seconds}}},
      {"entries", {{"queued", p.queued}, {"running", p.running}, {"locked", p.locked},
                   {"done", p.done}, {"failed", p.failed}}},
      {"eio", eio},
      {"jobs", opts_.scheduler.jobs},
      // Tools read the entries' true state there: through the mount, a pending entry
      // lists the model.neff it will produce.
      {"backing", opts_.backing},
  };
  if (opts_.tier) {
    j["s3"] = opts_.tier->stats();
    j["s3"]["url"] = opts_.s3_url;
  }
  return j.dump(2) + "\n";
}

// Whether an unmodified Neuron client compiles the entry itself: it holds a live
// existence-style lock (a lock file without our owner record). It will create
// model.neff itself, which a placeholder of that name would refuse (EEXIST to O_EXCL,
// EACCES to a write), so such an entry shows none; other clients wait for that lock
// as they would on a plain directory.
bool client_compiling(int dir_fd, const EntryFiles& files) {
  if (!files.has_lock()) return false;
  auto lock = inspect_lock_at(dir_fd, files.lock_name());
  return lock && lock->state == LockState::live && !lock->owner;
}

// Whether `dir_fd` is an entry folder whose model.neff/model.done may be produced.
bool Filesystem::is_entry_dir(int dir_fd) const {
  int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return false;
  EntryFiles files;
  auto listed = detail::list_dir(fd, "entry", [&](std::string_view name, bool) { files.note(name); });
  return listed && files.has_hlo() && !files.done() && !client_compiling(dir_fd, files);
}

// The inode of a backing file, counting one more kernel lookup; a name seen last is
// where it is opened again (hard links, renames by other processes). Takes `path_fd`.
Filesystem::Inode* Filesystem::intern(Inode& parent, const char* name, int path_fd, const struct stat& st) {
  Inode* in;
  std::vector<Inode*> doomed;
  {
    std::lock_guard lk(inodes_mu_);
    auto& slot = inodes_[{st.st_dev, st.st_ino}];
    if (!slot) {
      slot = new Inode;
      slot->dev = st.st_dev;
      slot->ino = st.st_ino;
    }
    in = slot;
    ++in->nlookup;
    set_parent(in, parent, name, doomed);
  }
  destroy(doomed);
  keep_open(*in, std::make_shared<PathFd>(path_fd));
  return in;
}

int Filesystem::reply_entry(fuse_req_t req, Inode& parent, const char* name) {
  fuse_entry_param e{};
  int err = lookup_entry(parent, name, e);
  return err ? fuse_reply_err(req, err) : fuse_reply_entry(req, &e);
}

int Filesystem::lookup_entry(Inode& parent, const char* name, fuse_entry_param& e) {
  e = {};
  int err = 0;
  PathRef dir = path_fd(parent, err);
  if (!dir) return err;
  int fd = ::openat(dir->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  int open_errno = errno;
  // Not here yet: the S3 cache may have it.
  if (fd < 0 && open_errno == ENOENT && opts_.tier && opts_.tier->fill(path_of_fd(dir->fd), name)) {
    fd = ::openat(dir->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
    open_errno = errno;
  }
  if (fd < 0) {
    err = gone_or(open_errno, dir->fd);
    if (err == ENOENT && is_product_name(name) && is_entry_dir(dir->fd)) {
      // A placeholder for what a compile will produce.
      Inode* p;
      {
        std::lock_guard lk(inodes_mu_);
        auto& slot = placeholders_[{&parent, name}];
        if (!slot) {
          slot = new Inode;
          slot->placeholder = true;
          slot->parent = &parent;
          slot->name = name;
          ++parent.refs;
        }
        p = slot;
        ++p->nlookup;
      }
      e.ino = reinterpret_cast<fuse_ino_t>(p);
      e.attr.st_ino = static_cast<ino_t>(e.ino & 0x7fffffffffffULL);
      e.attr.st_mode = S_IFREG | 0444;
      e.attr.st_nlink = 1;
      e.attr_timeout = e.entry_timeout = 0;
      return 0;
    }
    if (err == EMFILE && !told_out_of_fds_.exchange(true)) {
      struct rlimit rl {};
      ::getrlimit(RLIMIT_NOFILE, &rl);
      fmt::print(stderr,
                 "neffcachefs: out of file descriptors (limit {}, of which up to {} for names): lookups fail "
                 "with EMFILE; raise the limit (LimitNOFILE= in the unit, ulimit -n)\n",
                 rl.rlim_cur, max_open_);
    }
    return err;
  }
  if (::fstat(fd, &e.attr) != 0) {
    int err = errno;
    ::close(fd);
    return err;
  }
  // A done entry and its files: their names never change while the entry exists.
  const std::string done(k_done_file);
  bool immutable = S_ISREG(e.attr.st_mode)   ? ::faccessat(dir->fd, done.c_str(), F_OK, 0) == 0
                   : S_ISDIR(e.attr.st_mode) ? ::faccessat(fd, done.c_str(), F_OK, 0) == 0
                                             : false;
  if (S_ISDIR(e.attr.st_mode) && std::string_view(name).starts_with(k_module_dir_prefix)) remove_stale_lock(fd);
  Inode* in = intern(parent, name, fd, e.attr);
  e.ino = reinterpret_cast<fuse_ino_t>(in);
  if (immutable) {
    in->finished = true;
    if (std::string_view(name) == k_neff_file) in->finished_neff = true;
  }
  e.attr_timeout = e.entry_timeout = immutable ? k_immutable_timeout : k_timeout;
  return 0;
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
  // Locks are forwarded to the backing files (see setlk and flock).
  if (conn->capable & FUSE_CAP_POSIX_LOCKS) conn->want |= FUSE_CAP_POSIX_LOCKS;
  if (conn->capable & FUSE_CAP_FLOCK_LOCKS) conn->want |= FUSE_CAP_FLOCK_LOCKS;
  // Cached pages and listings are checked against mtime whenever attributes are fetched.
  if (conn->capable & FUSE_CAP_AUTO_INVAL_DATA) conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
  no_opendir_ = conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT;
  if (no_opendir_) conn->want |= FUSE_CAP_NO_OPENDIR_SUPPORT;
  conn->want &= ~FUSE_CAP_EXPORT_SUPPORT;  // no ".." lookups from NFS re-export
  // A write or truncate by someone who may not keep a file's set-user-ID and
  // set-group-ID bits clears them. The kernel knows who that is (the daemon writes as
  // itself, and as root it would keep them): it does it, with a change of mode.
  conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
  conn->max_write = 1 << 20;
  conn->max_readahead = 1 << 20;
  // Parallel readers of many NEFFs: the kernel default of 12 throttles them.
  conn->max_background = 64;
  conn->congestion_threshold = 48;
}

void Filesystem::lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  Inode& p = inode(parent);
  // The counters live in a folder of the mount only; the backing store never has it.
  Inode* special = nullptr;
  if (parent == FUSE_ROOT_ID && std::strcmp(name, k_stats_dir) == 0) special = stats_dir_.get();
  if (&p == stats_dir_.get()) special = std::strcmp(name, k_stats_file) == 0 ? stats_file_.get() : nullptr;
  if (special || &p == stats_dir_.get()) {
    if (!special) return (void)fuse_reply_err(req, ENOENT);
    fuse_entry_param e{};
    e.ino = reinterpret_cast<fuse_ino_t>(special);
    getattr_of(*special, e.attr);
    return (void)fuse_reply_entry(req, &e);  // zero timeouts: the counters move
  }
  if (p.placeholder) return (void)fuse_reply_err(req, ENOTDIR);
  // The kernel resolves "." and ".." itself; refusing them here keeps the root a wall.
  if (std::strcmp(name, ".") == 0 || std::strcmp(name, "..") == 0 || std::strchr(name, '/'))
    return (void)fuse_reply_err(req, EINVAL);
  reply_entry(req, p, name);
}

void Filesystem::forget(fuse_ino_t ino, uint64_t n) {
  if (ino == FUSE_ROOT_ID) return;
  Inode* in = reinterpret_cast<Inode*>(ino);
  if (in->special != Inode::Special::none || n == 0) return;  // stats: owned by the file system
  std::vector<Inode*> doomed;
  {
    std::lock_guard lk(inodes_mu_);
    unref(in, n, doomed);
  }
  destroy(doomed);
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

void Filesystem::getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Inode& i = inode(ino);
  struct stat st {};
  double timeout = k_timeout;
  if (i.special != Inode::Special::none) {
    getattr_of(i, st);
    return (void)fuse_reply_attr(req, &st, 0);
  }
  if (i.placeholder) {
    timeout = 0;
    // Once produced, the real file's attributes: fstat after open shows the true size.
    int err = 0;
    PathRef dir = path_fd(*i.parent, err);
    if (!dir || ::fstatat(dir->fd, i.name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      st = {};
      st.st_mode = S_IFREG | 0444;
      st.st_nlink = 1;
    }
    st.st_ino = static_cast<ino_t>(ino & 0x7fffffffffffULL);
  } else if (fi && !i.placeholder) {  // an open file: its own descriptor, even unlinked
    if (::fstat(static_cast<int>(fi->fh), &st) != 0) return (void)fuse_reply_err(req, errno);
  } else {
    int err = 0;
    PathRef fd = path_fd(i, err);
    if (!fd) return (void)fuse_reply_err(req, err);
    if (::fstatat(fd->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return (void)fuse_reply_err(req, errno);
    if (i.finished) timeout = k_immutable_timeout;
  }
  fuse_reply_attr(req, &st, timeout);
}

void Filesystem::setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi) {
  Inode& i = inode(ino);
  if (i.placeholder || i.special != Inode::Special::none) return (void)fuse_reply_err(req, EACCES);
  int err = 0;
  PathRef fd = path_fd(i, err);
  if (!fd) return (void)fuse_reply_err(req, err);
  std::string path = proc_path(fd->fd);
  // A directory's handle is ours, not a descriptor: it is changed by path.
  struct stat own {};
  if (fi && (::fstat(fd->fd, &own) != 0 || !S_ISREG(own.st_mode))) fi = nullptr;
  int rc = 0;
  if (to_set & FUSE_SET_ATTR_MODE) rc = fi ? ::fchmod(static_cast<int>(fi->fh), attr->st_mode) : ::chmod(path.c_str(), attr->st_mode);
  if (rc == 0 && (to_set & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID))) {
    uid_t uid = (to_set & FUSE_SET_ATTR_UID) ? attr->st_uid : static_cast<uid_t>(-1);
    gid_t gid = (to_set & FUSE_SET_ATTR_GID) ? attr->st_gid : static_cast<gid_t>(-1);
    rc = ::fchownat(fd->fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW);
  }
  if (rc == 0 && (to_set & FUSE_SET_ATTR_SIZE))
    rc = fi ? ::ftruncate(static_cast<int>(fi->fh), attr->st_size) : ::truncate(path.c_str(), attr->st_size);
  if (rc == 0 && (to_set & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME))) {
    struct timespec tv[2];
    tv[0].tv_nsec = tv[1].tv_nsec = UTIME_OMIT;
    if (to_set & FUSE_SET_ATTR_ATIME_NOW) tv[0].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_ATIME) tv[0] = attr->st_atim;
    if (to_set & FUSE_SET_ATTR_MTIME_NOW) tv[1].tv_nsec = UTIME_NOW;
    else if (to_set & FUSE_SET_ATTR_MTIME) tv[1] = attr->st_mtim;
    rc = fi ? ::futimens(static_cast<int>(fi->fh), tv) : ::utimensat(AT_FDCWD, path.c_str(), tv, 0);
  }
  if (rc != 0) return (void)fuse_reply_err(req, errno);
  getattr(req, ino, fi);
}

void Filesystem::readlink(fuse_req_t req, fuse_ino_t ino) {
  Inode& i = inode(ino);
  if (i.placeholder || i.special != Inode::Special::none) return (void)fuse_reply_err(req, EINVAL);
  int err = 0;
  PathRef fd = path_fd(i, err);
  if (!fd) return (void)fuse_reply_err(req, err);
  char buf[PATH_MAX + 1];
  ssize_t n = ::readlinkat(fd->fd, "", buf, sizeof buf - 1);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  buf[n] = '\0';
  fuse_reply_readlink(req, buf);
}

void Filesystem::mknod_like(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, const char* target) {
  Inode& p = inode(parent);
  if (p.placeholder || p.special != Inode::Special::none)
    return (void)fuse_reply_err(req, p.placeholder ? ENOTDIR : EACCES);
  // Device nodes are refused: a compile cache has no use for them, the mount is nodev,
  // and the backing directory may not be (a root daemon would make them for the caller).
  if (S_ISCHR(mode) || S_ISBLK(mode)) return (void)fuse_reply_err(req, EPERM);
  int err = 0;
  PathRef dir = path_fd(p, err);
  if (!dir) return (void)fuse_reply_err(req, err);
  int rc;
  {
    CallersMode exact;
    rc = target ? ::symlinkat(target, dir->fd, name)
         : S_ISDIR(mode) ? ::mkdirat(dir->fd, name, mode)
                         : ::mknodat(dir->fd, name, mode, 0);
  }
  if (rc != 0) return (void)fuse_reply_err(req, gone_or(errno, dir->fd));
  if (as_root_) {
    detail::UniqueFd made(::openat(dir->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC));
    if (made.get() >= 0) give_to_caller(req, dir->fd, made.get());
  }
  reply_entry(req, p, name);
}

void Filesystem::give_to_caller(fuse_req_t req, int dir_fd, int fd) {
  if (!as_root_) return;  // then the caller is us
  const fuse_ctx* caller = fuse_req_ctx(req);
  struct stat parent {}, st {};
  if (::fstat(fd, &st) != 0) return;
  // In a set-group-ID folder the file keeps the folder's group, as on a local disk.
  const bool inherit_group = ::fstat(dir_fd, &parent) == 0 && (parent.st_mode & S_ISGID);
  const gid_t gid = inherit_group ? st.st_gid : caller->gid;
  if (st.st_uid == caller->uid && st.st_gid == gid) return;  // a root caller's own
  if (::fchownat(fd, "", caller->uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) != 0) return;
  // A change of owner clears a file's set-user-ID and set-group-ID bits; the caller asked
  // for them, and a local disk keeps them for the file's owner, set-group-ID only when the
  // owner is in the file's group.
  mode_t keep = st.st_mode & (S_ISUID | S_ISGID);
  if (S_ISDIR(st.st_mode) || S_ISLNK(st.st_mode) || keep == 0) return;
  if ((keep & S_ISGID) && !caller_in_group(req, gid)) keep &= ~S_ISGID;
  if (keep != 0) (void)!::chmod(proc_path(fd).c_str(), st.st_mode & 07777 & ~((S_ISUID | S_ISGID) & ~keep));
}

void Filesystem::unlink(fuse_req_t req, fuse_ino_t parent, const char* name, bool dir) {
  Inode& p = inode(parent);
  if (p.placeholder || p.special != Inode::Special::none)
    return (void)fuse_reply_err(req, p.placeholder ? ENOTDIR : EACCES);
  int err = 0;
  PathRef pfd = path_fd(p, err);
  if (!pfd) return (void)fuse_reply_err(req, err);
  if (!dir) forget_client_lock(pfd->fd, name);
  fuse_reply_err(req, ::unlinkat(pfd->fd, name, dir ? AT_REMOVEDIR : 0) == 0 ? 0 : errno);
}

void Filesystem::rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
                        const char* newname, unsigned flags) {
  Inode& p = inode(parent);
  Inode& np = inode(newparent);
  int err = 0;
  PathRef pfd = path_fd(p, err), npfd = pfd ? path_fd(np, err) : nullptr;
  if (!pfd || !npfd) return (void)fuse_reply_err(req, p.special != Inode::Special::none || np.special != Inode::Special::none ? EACCES : err);
  if (::syscall(SYS_renameat2, pfd->fd, name, npfd->fd, newname, flags) != 0) return (void)fuse_reply_err(req, errno);
  // The kernel keeps the moved inodes under their new names: so does this process.
  moved(np, npfd->fd, newname);
  if (flags & RENAME_EXCHANGE) moved(p, pfd->fd, name);
  fuse_reply_err(req, 0);
  // An HLO renamed into place is a finished write: start its compile (eager), or with an
  // S3 cache at least its upload.
  if (is_hlo_name(newname) && (opts_.eager || opts_.tier))
    request_compile(path_of(np), Priority::background, nullptr, /*upload_only=*/!opts_.eager);
}

void Filesystem::link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  Inode& i = inode(ino);
  Inode& np = inode(newparent);
  int err = 0;
  PathRef fd = path_fd(i, err), npfd = fd ? path_fd(np, err) : nullptr;
  if (!fd || !npfd) return (void)fuse_reply_err(req, i.placeholder || i.special != Inode::Special::none ? EPERM : err);
  if (::linkat(AT_FDCWD, proc_path(fd->fd).c_str(), npfd->fd, newname, AT_SYMLINK_FOLLOW) != 0)
    return (void)fuse_reply_err(req, errno);
  reply_entry(req, np, newname);
}

static void on_interrupt(fuse_req_t, void* data) {
  auto* w = static_cast<Filesystem::Waiter*>(data);
  // The waiter is alive: the pending compile's callback holds it until it is answered.
  auto& fs = *static_cast<Filesystem*>(fuse_req_userdata(w->req));
  std::shared_ptr<Filesystem::Waiter> alias(std::shared_ptr<Filesystem::Waiter>(), w);
  fs.answer(alias, nullptr, EINTR);
}

void Filesystem::open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  Inode& i = inode(ino);
  if (i.special != Inode::Special::none) {
    if (i.special == Inode::Special::stats_dir) return (void)fuse_reply_err(req, EISDIR);
    if ((fi->flags & O_ACCMODE) != O_RDONLY) return (void)fuse_reply_err(req, EACCES);
    // The counters as they were at the open: a reader that takes them in several reads
    // gets one document, not pieces of two (a counter that gains a digit shifts them).
    std::string text = stats_json();
    {
      std::lock_guard lk(snapshots_mu_);
      fi->fh = ++next_snapshot_;
      snapshots_.emplace(fi->fh, std::move(text));
    }
    fi->direct_io = 1;
    return (void)fuse_reply_open(req, fi);
  }
  if (!i.placeholder) {
    int err = 0;
    PathRef pfd = path_fd(i, err);
    if (!pfd) return (void)fuse_reply_err(req, err);
    // Unlinked behind the daemon's back while the kernel still knows the name (a done
    // entry removed or repaired): the kernel looks the name up again.
    struct stat st {};
    if (::fstat(pfd->fd, &st) == 0 && st.st_nlink == 0 && !S_ISDIR(st.st_mode)) return (void)fuse_reply_err(req, ESTALE);
    int fd = ::open(proc_path(pfd->fd).c_str(), fi->flags & ~O_NOFOLLOW);
    if (fd < 0) return (void)fuse_reply_err(req, errno);
    fi->fh = static_cast<uint64_t>(fd);
    // A done entry's files never change: keep their pages across opens, and their
    // closes need no FLUSH round trip (nothing to write back; a client that locks one
    // has its locks dropped at the release of its open instead).
    bool reading = (fi->flags & O_ACCMODE) == O_RDONLY;
    fi->keep_cache = reading && i.finished;
    fi->noflush = reading && i.finished;
    if (reading && i.finished_neff) {
      ++counters_.hits;
      if (opts_.tier) opts_.tier->opened(std::filesystem::path(path_of_fd(pfd->fd)).parent_path().string());
    }
    return (void)fuse_reply_open(req, fi);
  }
  ++counters_.misses;
  if ((fi->flags & O_ACCMODE) != O_RDONLY) return (void)fuse_reply_err(req, EACCES);
  Inode& parent = *i.parent;
  int err = 0;
  PathRef dir = path_fd(parent, err);
  if (!dir) return (void)fuse_reply_err(req, err);
  int fd = ::openat(dir->fd, i.name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {  // produced meanwhile
    fi->fh = static_cast<uint64_t>(fd);
    fi->direct_io = 1;
    return (void)fuse_reply_open(req, fi);
  }
  std::string entry = path_of_fd(dir->fd);
  auto files = read_entry_files(entry);
  if (files && files->failed() && !opts_.retry_failed) {
    eio(EioSite::failed_cached, fmt::format("{}: a failed compile is recorded (model.log)", entry));
    return (void)fuse_reply_err(req, EIO);
  }
  auto w = std::make_shared<Waiter>();
  w->req = req;
  w->ino = ino;
  w->parent = id_of(i.parent);
  w->name = i.name;
  w->entry = entry;
  w->parent_fd = ::dup(dir->fd);
  w->fi = *fi;
  ++counters_.waiters;
  fuse_req_interrupt_func(req, on_interrupt, w.get());
  if (opts_.wait_timeout.count() > 0) {
    std::lock_guard lk(deadline_mu_);
    auto at = deadlines_.emplace(std::chrono::steady_clock::now() + opts_.wait_timeout, w);
    if (at == deadlines_.begin()) deadline_cv_.notify_one();
  }
  request_compile(entry, Priority::waiting, w);
}

void Filesystem::answer(const std::shared_ptr<Waiter>& w, const CompileResult* result, int err) {
  if (w->answered.exchange(true)) return;
  --counters_.waiters;
  if (err == EINTR) ++counters_.interrupted;
  if (err == ETIMEDOUT) {
    eio(EioSite::wait_deadline, fmt::format("{}/{}: no compile result within --wait-timeout {} s; the compile goes on",
                                            w->entry, w->name, std::chrono::duration<double>(opts_.wait_timeout).count()));
    return (void)fuse_reply_err(w->req, EIO);
  }
  if (!result) return (void)fuse_reply_err(w->req, err);
  if (!is_success(result->outcome)) {
    bool recorded = result->outcome == CompileOutcome::failed || result->outcome == CompileOutcome::failed_cached;
    eio(recorded ? EioSite::compile_failed : EioSite::compile_transient,
        fmt::format("{}/{}: {} ({})", w->entry, w->name, to_string(result->outcome), result->message));
    return (void)fuse_reply_err(w->req, EIO);
  }
  int fd = ::openat(w->parent_fd, w->name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    eio(EioSite::publish_vanished,
        fmt::format("{}/{}: compiled but cannot be opened: {}", w->entry, w->name, std::strerror(errno)));
    return (void)fuse_reply_err(w->req, EIO);
  }
  fuse_file_info fi = w->fi;
  fi.fh = static_cast<uint64_t>(fd);
  // The kernel holds a zero-size placeholder: read through direct I/O, and drop its
  // cached attributes and name so that later lookups find the real file.
  fi.direct_io = 1;
  if (fuse_reply_open(w->req, &fi) != 0) ::close(fd);
  if (session_) {
    fuse_lowlevel_notify_inval_inode(session_, w->ino, 0, 0);
    fuse_lowlevel_notify_inval_entry(session_, w->parent, w->name.c_str(), w->name.size());
  }
}

void Filesystem::request_compile(const std::string& entry_dir, Priority prio, std::shared_ptr<Waiter> waiter,
                                 bool upload_only) {
  {
    std::lock_guard lk(prep_mu_);
    if (!prep_stop_) {
      prep_queue_.push_back({entry_dir, prio, std::move(waiter), upload_only});
      prep_cv_.notify_one();
      return;
    }
  }
  if (waiter) answer(waiter, nullptr, EIO);
}

void Filesystem::prepare_loop() {
  std::unique_lock lk(prep_mu_);
  for (;;) {
    prep_cv_.wait(lk, [&] { return prep_stop_ || !prep_queue_.empty(); });
    if (prep_stop_) return;
    PrepareItem item = std::move(prep_queue_.front());
    prep_queue_.pop_front();
    lk.unlock();
    if (item.upload_only) {
      if (auto up = opts_.tier->upload_inputs(item.entry_dir); !up)
        fmt::print(stderr, "neffcachefs: cannot upload {}: {}\n", item.entry_dir, up.error().message);
      lk.lock();
      continue;
    }
    JobSpec spec = prepare_job(item.entry_dir, opts_.default_flags);
    // Each S3 entry publishes its own NEFF: no copies between equal graphs.
    if (opts_.tier) spec.dedup_key.clear();
    auto w = item.waiter;
    scheduler_->submit(spec, item.prio, [this, w, entry = spec.entry_dir](const CompileResult& r) {
      if (w) answer(w, &r, 0);
      answer_queued(entry, r);
    });
    lk.lock();
  }
}

void Filesystem::answer_queued(const std::string& entry_dir, const CompileResult& r) {
  if (r.outcome == CompileOutcome::transient || r.outcome == CompileOutcome::busy) return;  // they ask again
  std::vector<std::shared_ptr<Waiter>> ready;
  {
    std::lock_guard lk(prep_mu_);
    std::erase_if(prep_queue_, [&](PrepareItem& item) {
      if (!item.waiter || item.entry_dir != entry_dir) return false;
      ready.push_back(std::move(item.waiter));
      return true;
    });
  }
  for (auto& w : ready) answer(w, &r, 0);
}

void Filesystem::create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  Inode& p = inode(parent);
  if (p.placeholder || p.special != Inode::Special::none) return (void)fuse_reply_err(req, EACCES);
  int err = 0;
  PathRef dir = path_fd(p, err);
  if (!dir) return (void)fuse_reply_err(req, err);
  bool existed = ::faccessat(dir->fd, name, F_OK, AT_SYMLINK_NOFOLLOW) == 0;
  // Never through a link: one planted in the backing directory between the kernel's
  // lookup and this create would make a root daemon create or truncate its target.
  int fd;
  {
    CallersMode exact;
    fd = ::openat(dir->fd, name, fi->flags | O_CREAT | O_CLOEXEC | O_NOFOLLOW, mode);
  }
  if (fd < 0) return (void)fuse_reply_err(req, gone_or(errno, dir->fd));
  // A lock file a client creates through the mount is owned by that client.
  if (!existed) {
    give_to_caller(req, dir->fd, fd);
    track_client_lock(req, dir->fd, name);
  }
  fuse_entry_param e{};
  int pfd = ::openat(dir->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (pfd < 0 || ::fstat(pfd, &e.attr) != 0) {
    int err = errno;
    ::close(fd);
    if (pfd >= 0) ::close(pfd);
    return (void)fuse_reply_err(req, err);
  }
  e.ino = reinterpret_cast<fuse_ino_t>(intern(p, name, pfd, e.attr));
  e.attr_timeout = e.entry_timeout = k_timeout;
  fi->fh = static_cast<uint64_t>(fd);
  if (fuse_reply_create(req, &e, fi) != 0) ::close(fd);
}

void Filesystem::read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  if (is_stats_file(ino)) {
    // A copy this thread owns: the reply wakes the client, whose close may free the
    // snapshot on another thread before the write of the reply has returned here.
    std::string piece;
    {
      std::lock_guard lk(snapshots_mu_);
      const std::string& text = snapshots_.at(fi->fh);
      piece = text.substr(std::min(text.size(), static_cast<std::size_t>(off)), size);
    }
    return (void)fuse_reply_buf(req, piece.data(), piece.size());
  }
  counters_.read_bytes += size;
  // Answered with the backing descriptor itself: libfuse splices file -> pipe ->
  // /dev/fuse, no copy through this process.
  fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
  buf.buf[0].flags = static_cast<fuse_buf_flags>(FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK);
  buf.buf[0].fd = static_cast<int>(fi->fh);
  buf.buf[0].pos = off;
  fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
}

void Filesystem::write(fuse_req_t req, const char* data, size_t size, off_t off, fuse_file_info* fi) {
  ssize_t n = ::pwrite(static_cast<int>(fi->fh), data, size, off);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_write(req, static_cast<size_t>(n));
}

void Filesystem::flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  // Every close() by the client: POSIX drops the closer's locks on the file. The kernel
  // keeps no record of locks it forwards, so they are dropped here.
  struct flock unlock {};
  unlock.l_type = F_UNLCK;
  unlock.l_whence = SEEK_SET;
  ::fcntl(static_cast<int>(fi->fh), F_OFD_SETLK, &unlock);
  // A client killed with an HLO open (FLUSH carries no open flags; release looks at
  // written files only, and forgets the mark of every file).
  if (opts_.eager && is_hlo_name(name_of(inode(ino))) && killed_while_exiting(fuse_req_ctx(req)->pid)) {
    std::lock_guard lk(cut_writes_mu_);
    cut_writes_.insert(fi->fh);
  }
  // close() of a duplicate reports delayed write errors (NFS) without ending the open.
  int dup = ::dup(static_cast<int>(fi->fh));
  fuse_reply_err(req, dup >= 0 && ::close(dup) == 0 ? 0 : errno);
}

void Filesystem::release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (is_stats_file(ino)) {
    std::unique_lock lk(snapshots_mu_);
    snapshots_.erase(fi->fh);
    lk.unlock();
    return (void)fuse_reply_err(req, 0);
  }
  std::string path;
  bool cut = false;
  {
    std::lock_guard lk(cut_writes_mu_);
    cut = cut_writes_.erase(fi->fh) > 0;
  }
  if ((opts_.eager || opts_.tier) && (fi->flags & O_ACCMODE) != O_RDONLY && !inode(ino).placeholder && !cut)
    path = path_of(inode(ino));
  ::close(static_cast<int>(fi->fh));
  fuse_reply_err(req, 0);
  // A client finished writing an HLO into an entry: compile it now, in the background.
  // (Not if the writer was killed: the file may be cut short, and its compile could record
  // a failure, or publish the NEFF of half a graph, under the whole graph's key.) With an
  // S3 cache the compile uploads the inputs first; without a compile they go up alone.
  if (!path.empty()) {
    std::filesystem::path p(path);
    const std::string name = p.filename().string();
    if (!p.parent_path().filename().string().starts_with(k_module_dir_prefix)) return;
    if (opts_.eager && is_hlo_name(name)) request_compile(p.parent_path().string(), Priority::background, nullptr);
    else if (opts_.tier && (is_hlo_name(name) || name == k_compile_flags_file))
      request_compile(p.parent_path().string(), Priority::background, nullptr, /*upload_only=*/true);
  }
}

void Filesystem::fsync(fuse_req_t req, int datasync, fuse_file_info* fi) {
  int fd = static_cast<int>(fi->fh);
  fuse_reply_err(req, (datasync ? ::fdatasync(fd) : ::fsync(fd)) == 0 ? 0 : errno);
}

// Folders are opened by the kernel alone when it can (no OPENDIR/RELEASEDIR requests:
// two round trips per folder of a walk). A listing is read at offset 0 and kept until
// its end is read; the kernel caches it and drops it when the folder's mtime changes,
// which every change of an entry's state does.
void Filesystem::opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  if (no_opendir_) return (void)fuse_reply_err(req, ENOSYS);
  if (inode(ino).placeholder) return (void)fuse_reply_err(req, ENOTDIR);
  fi->fh = 0;
  fi->cache_readdir = 1;
  fi->keep_cache = 1;
  fuse_reply_open(req, fi);
}

std::shared_ptr<const Filesystem::Listing> Filesystem::list(Inode& i, int& err) {
  if (i.special == Inode::Special::stats_dir)
    return std::make_shared<Listing>(Listing{{{".", 1, DT_DIR}, {"..", 1, DT_DIR}, {k_stats_file, 2, DT_REG}}});
  PathRef dir = path_fd(i, err);
  if (!dir) return nullptr;
  struct stat st {};
  if (::fstat(dir->fd, &st) == 0 && st.st_nlink == 0) return err = ESTALE, nullptr;  // removed meanwhile
  if (opts_.tier) opts_.tier->fill_listing(path_of_fd(dir->fd));
  int fd = ::openat(dir->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return err = errno, nullptr;
  DIR* d = ::fdopendir(fd);
  if (!d) return err = errno, ::close(fd), nullptr;
  auto h = std::make_shared<Listing>();
  EntryFiles files;
  while (dirent* e = ::readdir(d)) {
    // The root's .neffcache is the mount's own (stats.json); a backing folder of that
    // name (an S3 tier's staging) is not shown.
    if (&i == root_.get() && std::strcmp(e->d_name, k_stats_dir) == 0) continue;
    h->push_back({e->d_name, e->d_ino, e->d_type});
    files.note(e->d_name);
  }
  ::closedir(d);
  // A pending entry lists what opening it will produce.
  if (files.has_hlo() && !files.done() && !(files.has(EntryFile::log) && !opts_.retry_failed) &&
      !client_compiling(dir->fd, files)) {
    if (!files.has(EntryFile::neff)) h->push_back({std::string(k_neff_file), 0, DT_REG});
    if (!files.has(EntryFile::done)) h->push_back({std::string(k_done_file), 0, DT_REG});
  }
  return h;
}

void Filesystem::readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus) {
  Inode& dir = inode(ino);
  if (dir.placeholder) return (void)fuse_reply_err(req, ENOTDIR);
  std::shared_ptr<const Listing> h;
  if (off > 0) {
    std::lock_guard lk(listings_mu_);
    h = dir.listing;
  }
  if (!h) {
    int err = 0;
    if (!(h = list(dir, err))) return (void)fuse_reply_err(req, err);
    std::lock_guard lk(listings_mu_);
    dir.listing = h;
  }
  std::vector<char> buf(size);
  std::size_t used = 0;
  for (auto i = static_cast<std::size_t>(off); i < h->size(); ++i) {
    const auto& ent = (*h)[i];
    fuse_entry_param e{};
    // With plus, each name is looked up as the kernel would (one more reference to its
    // inode). Inode 0 means "no attributes, look it up yourself": for . and .., names
    // that went away meanwhile, and the mount-only folder.
    bool looked_up = plus && dir.special == Inode::Special::none && ent.name != "." && ent.name != ".." &&
                     lookup_entry(dir, ent.name.c_str(), e) == 0;
    if (!looked_up) {
      e = {};
      e.attr.st_ino = ent.ino ? ent.ino : 1;
      e.attr.st_mode = static_cast<mode_t>(ent.type) << 12;
    }
    char* at = buf.data() + used;
    std::size_t room = size - used, n;
    if (plus) n = fuse_add_direntry_plus(req, at, room, ent.name.c_str(), &e, static_cast<off_t>(i + 1));
    else n = fuse_add_direntry(req, at, room, ent.name.c_str(), &e.attr, static_cast<off_t>(i + 1));
    if (n > room) {
      if (looked_up) forget(e.ino, 1);  // not sent: the kernel never learns of it
      break;
    }
    used += n;
  }
  if (used == 0) {  // the end: let the listing go
    std::lock_guard lk(listings_mu_);
    if (dir.listing == h) dir.listing.reset();
  }
  fuse_reply_buf(req, buf.data(), used);
}

void Filesystem::statfs(fuse_req_t req, fuse_ino_t ino) {
  struct statvfs st {};
  int err = 0;
  PathRef fd = path_fd(inode(ino), err);
  if (::fstatvfs(fd ? fd->fd : root_fd_->fd, &st) != 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_statfs(req, &st);
}

void Filesystem::getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  int err = 0;
  PathRef fd = path_fd(inode(ino), err);
  if (!fd) return (void)fuse_reply_err(req, err == ENOENT ? ENODATA : err);
  std::vector<char> buf(size);
  ssize_t n = ::getxattr(proc_path(fd->fd).c_str(), name, size ? buf.data() : nullptr, size);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  if (size == 0) return (void)fuse_reply_xattr(req, static_cast<size_t>(n));
  fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
}

void Filesystem::listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  int err = 0;
  PathRef fd = path_fd(inode(ino), err);
  if (!fd && err != ENOENT) return (void)fuse_reply_err(req, err);
  if (!fd) return (void)(size ? fuse_reply_buf(req, nullptr, 0) : fuse_reply_xattr(req, 0));
  std::vector<char> buf(size);
  ssize_t n = ::listxattr(proc_path(fd->fd).c_str(), size ? buf.data() : nullptr, size);
  if (n < 0) return (void)fuse_reply_err(req, errno);
  if (size == 0) return (void)fuse_reply_xattr(req, static_cast<size_t>(n));
  fuse_reply_buf(req, buf.data(), static_cast<size_t>(n));
}

void Filesystem::setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size, int flags) {
  int err = 0;
  PathRef fd = path_fd(inode(ino), err);
  if (!fd) return (void)fuse_reply_err(req, err == ENOENT ? EACCES : err);
  fuse_reply_err(req, ::setxattr(proc_path(fd->fd).c_str(), name, value, size, flags) == 0 ? 0 : errno);
}

void Filesystem::removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  int err = 0;
  PathRef fd = path_fd(inode(ino), err);
  if (!fd) return (void)fuse_reply_err(req, err == ENOENT ? ENODATA : err);
  fuse_reply_err(req, ::removexattr(proc_path(fd->fd).c_str(), name) == 0 ? 0 : errno);
}

// Locks: a client's POSIX lock becomes an OFD lock, and its flock a flock, on this
// daemon's descriptor of the backing file, so a client locking through the mount and a
// tool locking the backing file see each other. (An OFD lock belongs to one open file,
// not to a process: two opens by one client conflict, which POSIX would not do.)
namespace {

// Retries a lock that must wait, on its own thread, so no FUSE worker is parked; an
// interrupt from the client, or shutdown, ends the wait with EINTR.
void wait_for_lock(fuse_req_t req, std::function<int()> attempt, LockWaiters& waiters) {
  {
    std::lock_guard lk(waiters.mu);
    ++waiters.running;
  }
  std::thread([req, attempt = std::move(attempt), &waiters] {
    int err;
    for (;;) {
      err = attempt();
      if (err != EAGAIN && err != EWOULDBLOCK) break;
      if (fuse_req_interrupted(req) || waiters.stop) {
        err = EINTR;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    fuse_reply_err(req, err);
    std::lock_guard lk(waiters.mu);
    if (--waiters.running == 0) waiters.idle.notify_all();
  }).detach();
}

}  // namespace

void Filesystem::getlk(fuse_req_t req, fuse_file_info* fi, struct flock* lock) {
  lock->l_pid = 0;  // required for OFD locks
  if (::fcntl(static_cast<int>(fi->fh), F_OFD_GETLK, lock) != 0) return (void)fuse_reply_err(req, errno);
  fuse_reply_lock(req, lock);
}

void Filesystem::setlk(fuse_req_t req, fuse_file_info* fi, struct flock* lock, bool sleep) {
  int fd = static_cast<int>(fi->fh);
  struct flock l = *lock;
  l.l_pid = 0;
  auto attempt = [fd, l]() mutable { return ::fcntl(fd, F_OFD_SETLK, &l) == 0 ? 0 : errno; };
  int err = attempt();
  if (sleep && (err == EAGAIN || err == EACCES))
    return wait_for_lock(req, [attempt]() mutable {
      int e = attempt();
      return e == EACCES ? EAGAIN : e;
    }, lock_waiters_);
  fuse_reply_err(req, err);
}

void Filesystem::flock(fuse_req_t req, fuse_file_info* fi, int op) {
  int fd = static_cast<int>(fi->fh);
  auto attempt = [fd, op] { return ::flock(fd, op | LOCK_NB) == 0 ? 0 : errno; };
  int err = attempt();
  if (err == EWOULDBLOCK && !(op & LOCK_NB)) return wait_for_lock(req, attempt, lock_waiters_);
  fuse_reply_err(req, err);
}

// C trampolines: libfuse calls these with the Filesystem as userdata.
const fuse_lowlevel_ops& Filesystem::ops() {
  static const fuse_lowlevel_ops table = [] {
    fuse_lowlevel_ops o{};
    o.init = [](void* ud, fuse_conn_info* c) { static_cast<Filesystem*>(ud)->init(c); };
    o.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r).lookup(r, p, n); };
    o.forget = [](fuse_req_t r, fuse_ino_t i, uint64_t n) {
      self(r).forget(i, n);
      fuse_reply_none(r);
    };
    o.forget_multi = [](fuse_req_t r, size_t count, fuse_forget_data* f) {
      for (size_t k = 0; k < count; ++k) self(r).forget(f[k].ino, f[k].nlookup);
      fuse_reply_none(r);
    };
    o.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r).getattr(r, i, fi); };
    o.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info* fi) { self(r).setattr(r, i, a, s, fi); };
    o.readlink = [](fuse_req_t r, fuse_ino_t i) { self(r).readlink(r, i); };
    o.mknod = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, dev_t) { self(r).mknod_like(r, p, n, m, nullptr); };
    o.mkdir = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m) { self(r).mknod_like(r, p, n, S_IFDIR | m, nullptr); };
    o.symlink = [](fuse_req_t r, const char* t, fuse_ino_t p, const char* n) { self(r).mknod_like(r, p, n, S_IFLNK, t); };
    o.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r).unlink(r, p, n, false); };
    o.rmdir = [](fuse_req_t r, fuse_ino_t p, const char* n) { self(r).unlink(r, p, n, true); };
    o.rename = [](fuse_req_t r, fuse_ino_t p, const char* n, fuse_ino_t np, const char* nn, unsigned f) {
      self(r).rename(r, p, n, np, nn, f);
    };
    o.link = [](fuse_req_t r, fuse_ino_t i, fuse_ino_t np, const char* nn) { self(r).link(r, i, np, nn); };
    o.open = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r).open(r, i, fi); };
    o.create = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, fuse_file_info* fi) { self(r).create(r, p, n, m, fi); };
    o.read = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info* fi) { self(r).read(r, i, s, off, fi); };
    o.write = [](fuse_req_t r, fuse_ino_t, const char* b, size_t s, off_t off, fuse_file_info* fi) { self(r).write(r, b, s, off, fi); };
    // stats.json has no backing descriptor: nothing to flush, sync or lock.
    o.flush = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
      if (self(r).is_special(i)) return (void)fuse_reply_err(r, 0);
      self(r).flush(r, i, fi);
    };
    o.release = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r).release(r, i, fi); };
    o.fsync = [](fuse_req_t r, fuse_ino_t i, int d, fuse_file_info* fi) {
      if (self(r).is_special(i)) return (void)fuse_reply_err(r, 0);
      self(r).fsync(r, d, fi);
    };
    o.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { self(r).opendir(r, i, fi); };
    o.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info*) {
      self(r).readdir(r, i, s, off, false);
    };
    o.readdirplus = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info*) {
      self(r).readdir(r, i, s, off, true);
    };
    o.releasedir = [](fuse_req_t r, fuse_ino_t, fuse_file_info*) { fuse_reply_err(r, 0); };
    o.fsyncdir = [](fuse_req_t r, fuse_ino_t, int, fuse_file_info*) { fuse_reply_err(r, 0); };
    o.statfs = [](fuse_req_t r, fuse_ino_t i) { self(r).statfs(r, i); };
    o.getlk = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi, struct flock* l) {
      if (self(r).is_special(i)) return (void)fuse_reply_err(r, ENOLCK);
      self(r).getlk(r, fi, l);
    };
    o.setlk = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi, struct flock* l, int sleep) {
      if (self(r).is_special(i)) return (void)fuse_reply_err(r, ENOLCK);
      self(r).setlk(r, fi, l, sleep != 0);
    };
    o.flock = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi, int op) {
      if (self(r).is_special(i)) return (void)fuse_reply_err(r, ENOLCK);
      self(r).flock(r, fi, op);
    };
    o.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) { self(r).getxattr(r, i, n, s); };
    o.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { self(r).listxattr(r, i, s); };
    o.setxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, const char* v, size_t s, int f) { self(r).setxattr(r, i, n, v, s, f); };
    o.removexattr = [](fuse_req_t r, fuse_ino_t i, const char* n) { self(r).removexattr(r, i, n); };
    return o;
  }();
  return table;
}

}  // namespace neffcachefs
