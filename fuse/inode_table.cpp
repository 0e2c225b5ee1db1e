// The inode table (inode_table.hpp).
#include "inode_table.hpp"

#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <utility>

#include <fmt/format.h>

namespace neffcachefs {

using neffcache::detail::UniqueFd;

std::string proc_path(int fd) { return fmt::format("/proc/self/fd/{}", fd); }

UniqueFd open_beneath(int root_fd, const std::string& rel, int flags) {
  struct open_how how {};
  how.flags = static_cast<uint64_t>(flags | O_CLOEXEC);
  how.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS;
  return UniqueFd(static_cast<int>(::syscall(SYS_openat2, root_fd, rel.empty() ? "." : rel.c_str(), &how, sizeof how)));
}

int gone_or(int err, int dir_fd) {
  struct stat st {};
  return err == ENOENT && ::fstat(dir_fd, &st) == 0 && st.st_nlink == 0 ? ESTALE : err;
}

InodeTable::InodeTable(const std::string& backing, const std::vector<std::string>& lowers, std::size_t max_open) {
  root_ = std::make_unique<Inode>();
  root_fd_ = std::make_shared<PathFd>(UniqueFd(::open(backing.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC)));
  layer_roots_.push_back(root_fd_);
  for (const auto& lower : lowers)
    layer_roots_.push_back(std::make_shared<PathFd>(UniqueFd(::open(lower.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC))));
  struct stat st {};
  ::fstat(root_fd_->get(), &st);
  root_->dev = st.st_dev;
  root_->ino = st.st_ino;
  root_->nlookup = 2;
  stats_dir_ = std::make_unique<Inode>();
  stats_dir_->special = Inode::Special::stats_dir;
  stats_file_ = std::make_unique<Inode>();
  stats_file_->special = Inode::Special::stats_file;
  if (max_open == 0) {
    // Half the descriptors for inodes; the rest for open files, compiles and locks.
    struct rlimit rl {};
    ::getrlimit(RLIMIT_NOFILE, &rl);
    max_open = std::max<std::size_t>(64, static_cast<std::size_t>(std::min<rlim_t>(rl.rlim_cur, 1 << 21) / 2));
  }
  max_open_ = max_open;
}

InodeTable::~InodeTable() {
  std::lock_guard lk(inodes_mu_);
  open_lru_.clear();
  for (auto& [key, in] : inodes_) delete in;
  for (auto& [key, in] : placeholders_) delete in;
  inodes_.clear();
  placeholders_.clear();
}

std::optional<fuse_ino_t> InodeTable::known(const struct stat& st) {
  std::lock_guard lk(inodes_mu_);
  if (root_->dev == st.st_dev && root_->ino == st.st_ino) return FUSE_ROOT_ID;
  auto it = inodes_.find({st.st_dev, st.st_ino});
  if (it == inodes_.end() || it->second->nlookup == 0) return std::nullopt;
  return id_of(it->second);
}

std::string InodeTable::name_of(Inode& i) {
  std::lock_guard lk(inodes_mu_);  // a rename may change it
  return i.name;
}

std::string InodeTable::path_of(Inode& i) {
  int err = 0;
  PathRef fd = path_fd(i, err);
  return fd ? path_of_fd(fd->get()) : std::string();
}

PathRef InodeTable::keep_open(Inode& i, PathRef fd, dev_t dev, ino_t ino) {
  std::vector<PathRef> closing;  // closed after the locks are let go
  std::lock_guard lk(inodes_mu_);
  // A copy up may have rebound the inode to another file meanwhile (rebind): then this
  // descriptor is not its own any more.
  if (i.dev != dev || i.ino != ino) return nullptr;
  std::lock_guard fk(fds_mu_);
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

PathRef InodeTable::path_fd(Inode& i, int& err) {
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
  std::string name, rel;
  dev_t dev;
  ino_t ino;
  int layer;
  {
    std::lock_guard lk(inodes_mu_);
    parent = i.parent;
    name = i.name;
    dev = i.dev;
    ino = i.ino;
    layer = i.layer;
    // In another layer than its folder: opened by its path in its own layer.
    if (parent->layer != layer) rel = rel_path_locked(i);
    ++parent->refs;  // a rename meanwhile must not free it under us
  }
  PathRef result;
  PathRef dir = rel.empty() ? path_fd(*parent, err) : layer_roots_[static_cast<std::size_t>(layer)];
  if (dir) {
    UniqueFd fd = rel.empty() ? UniqueFd(::openat(dir->get(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC))
                              : open_beneath(dir->get(), rel, O_PATH | O_NOFOLLOW);
    const int open_errno = errno;
    struct stat st {};
    if (fd && ::fstat(fd.get(), &st) == 0 && st.st_dev == dev && st.st_ino == ino) {
      result = keep_open(i, std::make_shared<PathFd>(std::move(fd)), dev, ino);
      if (!result) err = ESTALE;
    } else {
      // Gone or replaced by another process: the kernel looks the name up again.
      err = !fd && open_errno != ENOENT && open_errno != ENOTDIR && open_errno != ELOOP && open_errno != EXDEV
                ? open_errno
                : ESTALE;
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

void InodeTable::unref(Inode* in, uint64_t nlookup, std::vector<Inode*>& doomed) {
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

void InodeTable::set_parent(Inode* in, Inode& parent, const char* name, std::vector<Inode*>& doomed) {
  if (in->parent == &parent && in->name == name) return;
  ++parent.refs;
  Inode* old = std::exchange(in->parent, &parent);
  in->name = name;
  if (old) unref(old, 0, doomed);
}

void InodeTable::destroy(const std::vector<Inode*>& doomed) {
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

void InodeTable::forget(fuse_ino_t ino, uint64_t n) {
  if (ino == FUSE_ROOT_ID) return;
  Inode* in = reinterpret_cast<Inode*>(ino);
  if (in->special != Inode::Special::none || n == 0) return;  // stats: owned by the table
  std::vector<Inode*> doomed;
  {
    std::lock_guard lk(inodes_mu_);
    unref(in, n, doomed);
  }
  destroy(doomed);
}

void InodeTable::moved(Inode& parent, int parent_fd, const char* name) {
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

Inode* InodeTable::intern(Inode& parent, const char* name, UniqueFd path_fd, const struct stat& st, int layer) {
  Inode* in;
  std::vector<Inode*> doomed;
  {
    std::lock_guard lk(inodes_mu_);
    auto& slot = inodes_[{st.st_dev, st.st_ino}];
    if (!slot) {
      slot = new Inode;
      slot->dev = st.st_dev;
      slot->ino = st.st_ino;
      slot->layer = layer;
    }
    in = slot;
    ++in->nlookup;
    set_parent(in, parent, name, doomed);
  }
  destroy(doomed);
  keep_open(*in, std::make_shared<PathFd>(std::move(path_fd)), st.st_dev, st.st_ino);
  return in;
}

int InodeTable::layer_of(Inode& i) {
  std::lock_guard lk(inodes_mu_);
  return i.layer;
}

Inode* InodeTable::pin_parent(Inode& i) {
  std::lock_guard lk(inodes_mu_);
  ++i.parent->refs;
  return i.parent;
}

void InodeTable::unpin(Inode* in) {
  std::vector<Inode*> doomed;
  {
    std::lock_guard lk(inodes_mu_);
    unref(in, 0, doomed);
  }
  destroy(doomed);
}

std::string InodeTable::rel_path_locked(const Inode& i) const {
  std::string rel;
  for (const Inode* at = &i; at && at != root_.get(); at = at->parent) rel = rel.empty() ? at->name : at->name + "/" + rel;
  return rel;
}

std::string InodeTable::rel_path(Inode& i) {
  std::lock_guard lk(inodes_mu_);
  return rel_path_locked(i);
}

PathRef InodeTable::dir_in_layer(Inode& dir, std::size_t k, int& err) {
  std::string rel;
  {
    std::lock_guard lk(inodes_mu_);
    if (static_cast<std::size_t>(dir.layer) != k) rel = rel_path_locked(dir);
  }
  if (rel.empty() && (&dir != root_.get() || k == 0)) return path_fd(dir, err);
  UniqueFd fd = open_beneath(layer_roots_[k]->get(), rel, O_PATH | O_DIRECTORY);
  if (!fd) {
    err = errno == ENOTDIR || errno == ELOOP ? ENOENT : errno;
    return nullptr;
  }
  return std::make_shared<PathFd>(std::move(fd));
}

bool InodeTable::rebind(Inode& i, UniqueFd fd, const struct stat& st, int layer) {
  std::vector<PathRef> closing;  // closed after the locks are let go
  std::lock_guard lk(inodes_mu_);
  auto [it, fresh] = inodes_.try_emplace({st.st_dev, st.st_ino}, &i);
  if (!fresh) return it->second == &i;
  inodes_.erase({i.dev, i.ino});
  i.dev = st.st_dev;
  i.ino = st.st_ino;
  i.layer = layer;
  // The descriptor changes under the same lock: no request sees the new layer with the
  // old file's descriptor.
  std::lock_guard fk(fds_mu_);
  if (i.fd) {
    closing.push_back(std::move(i.fd));
    open_lru_.erase(i.lru);
  }
  i.fd = std::make_shared<PathFd>(std::move(fd));
  open_lru_.push_front(&i);
  i.lru = open_lru_.begin();
  return true;
}

Inode* InodeTable::intern_placeholder(Inode& parent, const char* name) {
  std::lock_guard lk(inodes_mu_);
  auto& slot = placeholders_[{&parent, name}];
  if (!slot) {
    slot = new Inode;
    slot->placeholder = true;
    slot->parent = &parent;
    slot->name = name;
    ++parent.refs;
  }
  ++slot->nlookup;
  return slot;
}

InodeTable::Census InodeTable::census() {
  Census c;
  {
    std::lock_guard lk(inodes_mu_);
    c.inodes = inodes_.size();
    c.placeholders = placeholders_.size();
  }
  std::lock_guard lk(fds_mu_);
  c.open = open_lru_.size();
  return c;
}

}  // namespace neffcachefs
