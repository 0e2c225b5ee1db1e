// A caller of the daemon's handlers without a mount (caller.hpp): this process's ids, and
// kept requests whose answers are recorded for the test to wait on.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "caller.hpp"

namespace neffcachefs::without_mount {

// What a kept request was answered, once it was.
struct Answered {
  std::mutex mu;
  std::condition_variable cv;
  int answers = 0;             // more than one is a bug of the daemon
  std::optional<int> err;      // fail(err)
  std::optional<fuse_file_info> opened;
  void (*on_interrupt)(void*) = nullptr;
  void* interrupt_data = nullptr;
  bool interrupted = false;

  // Waits up to `limit` for the answer; false if none came.
  bool wait(std::chrono::milliseconds limit = std::chrono::milliseconds(120000)) {
    std::unique_lock lk(mu);
    return cv.wait_for(lk, limit, [&] { return answers > 0; });
  }
  // The caller gives up, as an interrupt from the kernel would say.
  void interrupt() {
    void (*f)(void*);
    void* data;
    {
      std::lock_guard lk(mu);
      interrupted = true;
      f = on_interrupt;
      data = interrupt_data;
    }
    if (f) f(data);
  }
};

class RecordedLater final : public Later {
 public:
  explicit RecordedLater(std::shared_ptr<Answered> a) : a_(std::move(a)) {}
  void fail(int err) override { answer([&] { a_->err = err; }); }
  void opened(const fuse_file_info& fi) override { answer([&] { a_->opened = fi; }); }
  bool interrupted() override {
    std::lock_guard lk(a_->mu);
    return a_->interrupted;
  }
  // As libfuse does: called at once when the caller gave up already, and never after the
  // answer.
  void on_interrupt(void (*f)(void*), void* data) override {
    {
      std::lock_guard lk(a_->mu);
      if (a_->answers > 0) return;
      a_->on_interrupt = f;
      a_->interrupt_data = data;
      if (!a_->interrupted) return;
    }
    f(data);
  }

 private:
  template <class F>
  void answer(F set) {
    {
      std::lock_guard lk(a_->mu);
      ++a_->answers;
      a_->on_interrupt = nullptr;
      set();
    }
    a_->cv.notify_all();
  }
  std::shared_ptr<Answered> a_;
};

class TestCaller final : public Caller {
 public:
  TestCaller() : Caller(::geteuid(), ::getegid(), ::getpid()) {}
  bool in_group(gid_t g) const override {
    if (g == gid) return true;
    std::vector<gid_t> groups(static_cast<std::size_t>(std::max(::getgroups(0, nullptr), 0)));
    const int n = ::getgroups(static_cast<int>(groups.size()), groups.data());
    return n > 0 && std::find(groups.begin(), groups.begin() + n, g) != groups.begin() + n;
  }
  // Keeps a request whose answers kept() returns, until another is kept.
  std::unique_ptr<Later> keep() const override {
    *kept_ = std::make_shared<Answered>();
    return std::make_unique<RecordedLater>(*kept_);
  }
  // The answers of the request kept last (null if none was kept).
  std::shared_ptr<Answered> kept() const { return *kept_; }
  // Backing files registered for FUSE passthrough: ids from 1, none while `refuse`.
  struct Backings {
    bool refuse = false;
    int refuse_with = 0;  // the errno of a refusal
    int registered = 0;
    std::vector<int> closed;
  };
  int open_backing(int) const override {
    if (!backings_->refuse) return ++backings_->registered;
    errno = backings_->refuse_with;
    return 0;
  }
  void close_backing(int id) const override { backings_->closed.push_back(id); }
  Backings& backings() const { return *backings_; }

 private:
  std::shared_ptr<Backings> backings_ = std::make_shared<Backings>();
  std::shared_ptr<std::shared_ptr<Answered>> kept_ = std::make_shared<std::shared_ptr<Answered>>();
};

}  // namespace neffcachefs::without_mount
