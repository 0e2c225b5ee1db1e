// The FUSE boundary: the low-level ops table, the C trampolines, and the only calls of
// libfuse's fuse_reply_* functions (reply.hpp). Handlers return values or errnos; here
// they become replies. Requests kept for later (opens waiting on a compile, locks
// waiting for their holder) are answered through a Later made here of the request.
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <memory>
#include <vector>

#include <neffcache/core/detail/fs.hpp>

#include "caller.hpp"
#include "fs.hpp"
#include "reply.hpp"

namespace neffcachefs {

namespace {

Filesystem& self(fuse_req_t req) { return *static_cast<Filesystem*>(fuse_req_userdata(req)); }

// An open's descriptor is the kernel's once the reply is sent; if the request is gone
// (interrupted, the mount aborted), nobody will release it.
void reply_open(fuse_req_t req, const fuse_file_info& fi) {
  if (fuse_reply_open(req, &fi) != 0) neffcache::detail::UniqueFd(static_cast<int>(fi.fh)).reset();
}

// A kept request (reply.hpp). libfuse calls an interrupt callback with the request's lock
// held, and an interrupt that came before the callback was registered at once, from inside
// fuse_req_interrupt_func, before that function unlocks the request: an answer from there
// would free the request under its own lock. That call is put off until registration
// returns. Before an answer, the callback is unregistered, which waits for one under way
// (it holds the request's lock) and keeps any from starting after the answer, when the
// Waiter that is its data may be gone; the callback's own answer needs no such wait.
class FuseLater final : public Later {
 public:
  explicit FuseLater(fuse_req_t req) : req_(req) {}
  void fail(int err) override {
    quiet();
    fuse_reply_err(req_, err);
  }
  void opened(const fuse_file_info& fi) override {
    quiet();
    reply_open(req_, fi);
  }
  bool interrupted() override { return fuse_req_interrupted(req_) != 0; }
  void on_interrupt(void (*f)(void*), void* data) override {
    f_ = f;
    data_ = data;
    registering_ = true;
    fuse_req_interrupt_func(req_, &FuseLater::called, this);
    registering_ = false;
    if (early_.load()) call();
  }

 private:
  static void called(fuse_req_t, void* self) {
    auto* later = static_cast<FuseLater*>(self);
    if (later->registering_.load()) return (void)later->early_.store(true);
    later->call();
  }
  void call() {
    in_callback = this;
    f_(data_);
    in_callback = nullptr;
  }
  void quiet() {
    if (f_ && in_callback != this) fuse_req_interrupt_func(req_, nullptr, nullptr);
  }
  static thread_local const FuseLater* in_callback;

  fuse_req_t req_;
  void (*f_)(void*) = nullptr;
  void* data_ = nullptr;
  std::atomic<bool> registering_{false}, early_{false};
};

thread_local const FuseLater* FuseLater::in_callback = nullptr;

// The caller of a request (caller.hpp).
class FuseCaller final : public Caller {
 public:
  explicit FuseCaller(fuse_req_t req)
      : Caller(fuse_req_ctx(req)->uid, fuse_req_ctx(req)->gid, fuse_req_ctx(req)->pid), req_(req) {}
  bool in_group(gid_t g) const override {
    if (g == gid) return true;
    std::vector<gid_t> groups(64);
    int n = fuse_req_getgroups(req_, static_cast<int>(groups.size()), groups.data());
    if (n > static_cast<int>(groups.size())) {  // it says how many there are
      groups.resize(static_cast<std::size_t>(n));
      n = fuse_req_getgroups(req_, n, groups.data());
    }
    if (n <= 0) return false;
    groups.resize(std::min(groups.size(), static_cast<std::size_t>(n)));
    return std::find(groups.begin(), groups.end(), g) != groups.end();
  }
  std::unique_ptr<Later> keep() const override { return std::make_unique<FuseLater>(req_); }
#ifdef FUSE_CAP_PASSTHROUGH
  int open_backing(int fd) const override { return fuse_passthrough_open(req_, fd); }
  void close_backing(int id) const override { fuse_passthrough_close(req_, id); }
#endif

 private:
  fuse_req_t req_;
};

// An entry whose answer did not reach the kernel (its request was interrupted, the
// connection aborted): the kernel never took the reference the lookup counted.
void reply_entry(fuse_req_t req, Answer<fuse_entry_param> a) {
  if (!a.ok()) return (void)fuse_reply_err(req, a.error());
  Filesystem& fs = self(req);
  if (fuse_reply_entry(req, &a.value()) != 0 && a.value().ino != 0) fs.forget(a.value().ino, 1);
}

void reply_attr(fuse_req_t req, Answer<Filesystem::Attr> a) {
  if (!a.ok()) return (void)fuse_reply_err(req, a.error());
  fuse_reply_attr(req, &a.value().st, a.value().timeout);
}

void reply_xattr(fuse_req_t req, Answer<Filesystem::Xattr> a) {
  if (!a.ok()) return (void)fuse_reply_err(req, a.error());
  const auto& x = a.value();
  if (x.size_only) return (void)fuse_reply_xattr(req, x.size);
  fuse_reply_buf(req, x.bytes.data(), x.bytes.size());
}

// setlk and flock: Deferred means a lock thread replies later.
void reply_lock_answer(fuse_req_t req, const Answer<Ok>& a) {
  if (!a.deferred()) fuse_reply_err(req, a.error());
}

// A reply frees its request, whether or not it reached the kernel: what follows a failed
// one uses `fs`, taken before.
void op_open(fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
  Filesystem& fs = self(r);
  auto a = fs.open(FuseCaller(r), i, *fi);
  if (a.deferred()) return;  // the compile's answer replies (CompileOnOpen::answer)
  if (!a.ok()) return (void)fuse_reply_err(r, a.error());
  if (fuse_reply_open(r, &a.value()) != 0) fs.not_opened(i, a.value());
}

void op_create(fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, fuse_file_info* fi) {
  Filesystem& fs = self(r);
  auto a = fs.create(FuseCaller(r), p, n, m, *fi);
  if (!a.ok()) return (void)fuse_reply_err(r, a.error());
  auto& c = a.value();
  if (fuse_reply_create(r, &c.entry, &c.fi) != 0) fs.not_created(c);
}

void op_read(fuse_req_t r, fuse_ino_t i, size_t size, off_t off, fuse_file_info* fi) {
  if (auto bytes = self(r).read_special(i, size, off, *fi)) return (void)fuse_reply_buf(r, bytes->data(), bytes->size());
  // Read into a buffer this thread keeps, whose pages stay mapped. libfuse's own answer
  // from a descriptor (fuse_reply_data) splices only until a splice from a file not yet
  // in the page cache answers EAGAIN, which it takes for a broken kernel: from then on it
  // reads every request into a buffer it allocates and frees, a fresh mapping each time,
  // whose page faults and unmapping cost 7 CPU seconds per GiB here (docs/BENCHMARKS.md).
  // Aligned to a page: the backing file is open with the reader's flags, O_DIRECT too.
  struct Buffer {
    std::unique_ptr<char, decltype(&std::free)> bytes{nullptr, &std::free};
    size_t size = 0;
  };
  static thread_local Buffer buf;
  if (buf.size < size) {
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE)), want = (size + page - 1) / page * page;
    buf.bytes.reset(static_cast<char*>(std::aligned_alloc(page, want)));
    buf.size = buf.bytes ? want : 0;
    if (!buf.bytes) return (void)fuse_reply_err(r, ENOMEM);
  }
  // Whole, or up to the end of the file: a short answer tells the kernel the file ends there.
  size_t got = 0;
  while (got < size) {
    const ssize_t n = ::pread(static_cast<int>(fi->fh), buf.bytes.get() + got, size - got, off + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && got == 0) return (void)fuse_reply_err(r, errno);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
  }
  fuse_reply_buf(r, buf.bytes.get(), got);
}

void op_readdir(fuse_req_t r, fuse_ino_t i, size_t size, off_t off, bool plus) {
  std::vector<char> buf(size);
  std::size_t used = 0;
  int err = self(r).readdir(i, off, plus, [&](const std::string& name, const fuse_entry_param& e, off_t next, bool with_attrs) {
    char* at = buf.data() + used;
    std::size_t room = size - used, n;
    if (with_attrs) n = fuse_add_direntry_plus(r, at, room, name.c_str(), &e, next);
    else n = fuse_add_direntry(r, at, room, name.c_str(), &e.attr, next);
    if (n > room) return false;
    used += n;
    return true;
  });
  if (err) return (void)fuse_reply_err(r, err);
  fuse_reply_buf(r, buf.data(), used);
}

}  // namespace

void notify_produced(fuse_session* se, fuse_ino_t ino, fuse_ino_t parent, const std::string& name) {
  if (!se) return;
  fuse_lowlevel_notify_inval_inode(se, ino, 0, 0);
  fuse_lowlevel_notify_inval_entry(se, parent, name.c_str(), name.size());
}

void notify_changed(fuse_session* se, fuse_ino_t ino) {
  if (se) fuse_lowlevel_notify_inval_inode(se, ino, 0, 0);
}

const fuse_lowlevel_ops& Filesystem::ops() {
  static const fuse_lowlevel_ops table = [] {
    fuse_lowlevel_ops o{};
    o.init = [](void* ud, fuse_conn_info* c) { static_cast<Filesystem*>(ud)->init(c); };
    o.lookup = [](fuse_req_t r, fuse_ino_t p, const char* n) { reply_entry(r, self(r).lookup(p, n)); };
    o.forget = [](fuse_req_t r, fuse_ino_t i, uint64_t n) {
      self(r).forget(i, n);
      fuse_reply_none(r);
    };
    o.forget_multi = [](fuse_req_t r, size_t count, fuse_forget_data* f) {
      for (size_t k = 0; k < count; ++k) self(r).forget(f[k].ino, f[k].nlookup);
      fuse_reply_none(r);
    };
    o.getattr = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { reply_attr(r, self(r).getattr(i, fi)); };
    o.setattr = [](fuse_req_t r, fuse_ino_t i, struct stat* a, int s, fuse_file_info* fi) {
      reply_attr(r, self(r).setattr(i, a, s, fi));
    };
    o.readlink = [](fuse_req_t r, fuse_ino_t i) {
      auto a = self(r).readlink(i);
      if (!a.ok()) return (void)fuse_reply_err(r, a.error());
      fuse_reply_readlink(r, a.value().c_str());
    };
    o.mknod = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m, dev_t) {
      reply_entry(r, self(r).mknod_like(FuseCaller(r), p, n, m, nullptr));
    };
    o.mkdir = [](fuse_req_t r, fuse_ino_t p, const char* n, mode_t m) {
      reply_entry(r, self(r).mknod_like(FuseCaller(r), p, n, S_IFDIR | m, nullptr));
    };
    o.symlink = [](fuse_req_t r, const char* t, fuse_ino_t p, const char* n) {
      reply_entry(r, self(r).mknod_like(FuseCaller(r), p, n, S_IFLNK, t));
    };
    o.unlink = [](fuse_req_t r, fuse_ino_t p, const char* n) { fuse_reply_err(r, self(r).unlink(p, n, false)); };
    o.rmdir = [](fuse_req_t r, fuse_ino_t p, const char* n) { fuse_reply_err(r, self(r).unlink(p, n, true)); };
    o.rename = [](fuse_req_t r, fuse_ino_t p, const char* n, fuse_ino_t np, const char* nn, unsigned f) {
      fuse_reply_err(r, self(r).rename(p, n, np, nn, f));
    };
    o.link = [](fuse_req_t r, fuse_ino_t i, fuse_ino_t np, const char* nn) { reply_entry(r, self(r).link(i, np, nn)); };
    o.open = op_open;
    o.create = op_create;
    o.read = op_read;
    o.write = [](fuse_req_t r, fuse_ino_t, const char* b, size_t s, off_t off, fuse_file_info* fi) {
      auto a = self(r).write(b, s, off, *fi);
      if (!a.ok()) return (void)fuse_reply_err(r, a.error());
      fuse_reply_write(r, a.value());
    };
    o.flush = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) { fuse_reply_err(r, self(r).flush(FuseCaller(r), i, *fi)); };
    o.release = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
      fuse_reply_err(r, self(r).release(FuseCaller(r), i, *fi));
    };
    o.fsync = [](fuse_req_t r, fuse_ino_t i, int d, fuse_file_info* fi) { fuse_reply_err(r, self(r).fsync(i, d, *fi)); };
    o.fallocate = [](fuse_req_t r, fuse_ino_t i, int mode, off_t off, off_t len, fuse_file_info* fi) {
      fuse_reply_err(r, self(r).fallocate(i, mode, off, len, *fi));
    };
    o.copy_file_range = [](fuse_req_t r, fuse_ino_t in, off_t in_off, fuse_file_info* in_fi, fuse_ino_t out,
                           off_t out_off, fuse_file_info* out_fi, size_t len, int flags) {
      auto a = self(r).copy_file_range(in, in_off, *in_fi, out, out_off, *out_fi, len, flags);
      if (!a.ok()) return (void)fuse_reply_err(r, a.error());
      fuse_reply_write(r, a.value());
    };
    o.lseek = [](fuse_req_t r, fuse_ino_t i, off_t off, int whence, fuse_file_info* fi) {
      auto a = self(r).lseek(i, off, whence, *fi);
      if (!a.ok()) return (void)fuse_reply_err(r, a.error());
      fuse_reply_lseek(r, a.value());
    };
    o.opendir = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi) {
      auto a = self(r).opendir(i, *fi);
      if (!a.ok()) return (void)fuse_reply_err(r, a.error());
      *fi = a.value();
      fuse_reply_open(r, fi);
    };
    o.readdir = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info*) { op_readdir(r, i, s, off, false); };
    o.readdirplus = [](fuse_req_t r, fuse_ino_t i, size_t s, off_t off, fuse_file_info*) { op_readdir(r, i, s, off, true); };
    o.releasedir = [](fuse_req_t r, fuse_ino_t, fuse_file_info*) { fuse_reply_err(r, 0); };
    o.fsyncdir = [](fuse_req_t r, fuse_ino_t, int, fuse_file_info*) { fuse_reply_err(r, 0); };
    o.statfs = [](fuse_req_t r, fuse_ino_t i) {
      auto a = self(r).statfs(i);
      if (!a.ok()) return (void)fuse_reply_err(r, a.error());
      fuse_reply_statfs(r, &a.value());
    };
    o.getlk = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi, struct flock* l) {
      auto a = self(r).getlk(i, *fi, *l);
      if (!a.ok()) return (void)fuse_reply_err(r, a.error());
      fuse_reply_lock(r, &a.value());
    };
    o.setlk = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi, struct flock* l, int sleep) {
      reply_lock_answer(r, self(r).setlk(FuseCaller(r), i, *fi, *l, sleep != 0));
    };
    o.flock = [](fuse_req_t r, fuse_ino_t i, fuse_file_info* fi, int op) {
      reply_lock_answer(r, self(r).flock(FuseCaller(r), i, *fi, op));
    };
    o.getxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, size_t s) { reply_xattr(r, self(r).getxattr(i, n, s)); };
    o.listxattr = [](fuse_req_t r, fuse_ino_t i, size_t s) { reply_xattr(r, self(r).listxattr(i, s)); };
    o.setxattr = [](fuse_req_t r, fuse_ino_t i, const char* n, const char* v, size_t s, int f) {
      fuse_reply_err(r, self(r).setxattr(i, n, v, s, f));
    };
    o.removexattr = [](fuse_req_t r, fuse_ino_t i, const char* n) { fuse_reply_err(r, self(r).removexattr(i, n)); };
    return o;
  }();
  return table;
}

}  // namespace neffcachefs
