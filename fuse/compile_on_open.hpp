// Compile-on-open: the open of a placeholder keeps its request and submits the entry's
// compile; the reply comes from the scheduler's callback, so no handler thread waits.
//
// Parts, each with its own mutex (ranks in fs.hpp):
// - PrepareQueue: entries to prepare. Preparing a job reads the whole HLO, so it happens
//   on the prepare thread, never in a handler.
// - Deadlines: waiters with a deadline (--wait-timeout), earliest first, and the thread
//   that answers them when it passes.
// - CompileOnOpen: ties them to the scheduler and answers each waiter once.
//
// Callbacks and locks: Scheduler::submit may run its callback ON THE CALLING THREAD (when
// the answer is known at submit: a settled entry, a shut-down scheduler), despite what
// scheduler.hpp says. The callback takes PrepareQueue's mutex (answer_queued). That is
// safe by construction: the mutex is private to PrepareQueue, whose methods call nothing
// outside it, so no thread holds it while calling submit (or anything else). Waiters are
// answered with no lock held.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <neffcache/core/detail/fs.hpp>
#include <neffcache/compile/scheduler.hpp>

#include "options.hpp"
#include "reply.hpp"
#include "stats.hpp"

namespace neffcachefs {

class CompileOnOpen;
class Caller;

// An open waiting for a compile: the kept request and what its reply needs.
struct Waiter {
  CompileOnOpen* owner = nullptr;
  std::unique_ptr<Later> later;  // the kept open
  fuse_ino_t ino = 0;
  fuse_ino_t parent = 0;
  std::string name;
  std::string entry;  // the entry folder's path, for the log
  neffcache::detail::UniqueFd parent_fd;
  fuse_file_info fi{};
  std::atomic<bool> answered{false};
};

// Entries to prepare, in order.
class PrepareQueue {
 public:
  struct Item {
    std::string entry_dir;
    neffcache::Priority prio;
    std::shared_ptr<Waiter> waiter;
    bool upload_only = false;  // S3: send the entry's inputs to the bucket, no compile
    uint64_t seq = 0;          // set by push: the items pushed before it
  };
  // False once stopped (the item is not taken).
  bool push(Item item);
  // The next item; nullopt once stopped (items left stay for stop()'s caller).
  std::optional<Item> pop();
  // How many items were ever pushed: a mark for take_waiters.
  uint64_t pushed();
  // Takes the waiters queued for `entry_dir` out of the queue, of the first `before`
  // pushes only (those queued before pushed() returned it).
  std::vector<std::shared_ptr<Waiter>> take_waiters(const std::string& entry_dir, uint64_t before);
  // Stops: pop() returns nullopt from now on. Returns the items never popped. Only the
  // first call stops (and returns them); `first` says whether this was it.
  std::deque<Item> stop(bool& first);

 private:
  // Rank 10 (docs/ARCHITECTURE.md). Private, and no method calls out while holding it: so no
  // thread holds it while calling Scheduler::submit, whose callback may take it.
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> items_;
  uint64_t pushed_ = 0;
  bool stop_ = false;
};

// The waiters queued in `queue` for `entry_dir` that its result `r` answers, taken out of
// it: those queued before the folder was read, if it shows r (shows_result), else none.
// A waiter's caller may act on the result (`neffcache retry` removes model.log) and open
// again; that open must not get the result it acted on.
std::vector<std::shared_ptr<Waiter>> waiters_answered_by(PrepareQueue& queue, const std::string& entry_dir,
                                                         const neffcache::CompileResult& r);

// Waiters with a deadline, earliest first; those answered meanwhile are skipped.
class Deadlines {
 public:
  using Clock = std::chrono::steady_clock;
  using Expire = std::function<void(const std::shared_ptr<Waiter>&)>;
  ~Deadlines() { stop(); }
  // Starts the thread that calls `expire` (with no lock held) as deadlines pass.
  void start(Expire expire);
  void add(Clock::time_point at, const std::shared_ptr<Waiter>& w);
  void stop();
  std::size_t pending();

 private:
  void loop();
  Expire expire_;
  // Rank 20 (docs/ARCHITECTURE.md): guards deadlines_ and stop_. A leaf: `expire` runs without it.
  std::mutex mu_;
  std::condition_variable cv_;
  std::multimap<Clock::time_point, std::weak_ptr<Waiter>> deadlines_;
  bool stop_ = false;
  std::thread thread_;
};

class CompileOnOpen {
 public:
  CompileOnOpen(const Options& opts, Stats& stats) : opts_(opts), stats_(stats) {}
  ~CompileOnOpen() { shutdown(); }
  CompileOnOpen(const CompileOnOpen&) = delete;
  CompileOnOpen& operator=(const CompileOnOpen&) = delete;

  void set_session(fuse_session* se) { session_ = se; }
  // Called with an entry's folder each time a job of it ends (a NEFF published, a failure
  // recorded, a publish finished, nothing): off the handler threads. Set once, before start.
  void when_ended(std::function<void(const std::string& entry_dir)> f) { ended_ = std::move(f); }
  // Starts the scheduler's workers, the prepare thread and (with --wait-timeout) the
  // deadline thread.
  void start();
  // Drops queued work, stops running compiles, answers every waiter.
  void shutdown();
  neffcache::Progress progress() const { return scheduler_->progress(); }

  // The open of placeholder `ino` (`name` in folder `dir_fd`, inode `parent`): the file
  // if it was produced meanwhile, EIO for a recorded failure, else Deferred (the compile
  // is requested, and the caller's request kept and answered when it ends).
  Answer<fuse_file_info> open(const Caller& caller, fuse_ino_t ino, fuse_ino_t parent, const std::string& name,
                              int dir_fd, const fuse_file_info& fi);
  // Starts the work `action` for an entry in the background (eager compile, upload).
  void request(const std::string& entry_dir, neffcache::Priority prio, std::shared_ptr<Waiter> waiter,
               bool upload_only = false);
  // Answers a waiter once (the compile result, an interrupt or a deadline, whichever
  // comes first; err: EINTR, ETIMEDOUT, or EIO without a result).
  void answer(const std::shared_ptr<Waiter>& w, const neffcache::CompileResult* result, int err);

 private:
  void prepare_loop();
  // Answers the waiters still queued for preparing `entry_dir` with its result, if it is
  // one they would get again (waiters_answered_by): opens that came during a compile
  // wait no longer than it.
  void answer_queued(const std::string& entry_dir, const neffcache::CompileResult& r);

  const Options& opts_;
  Stats& stats_;
  fuse_session* session_ = nullptr;
  std::function<void(const std::string&)> ended_;
  std::unique_ptr<neffcache::Scheduler> scheduler_;
  PrepareQueue queue_;
  Deadlines deadlines_;
  std::thread prep_thread_;
};

}  // namespace neffcachefs
