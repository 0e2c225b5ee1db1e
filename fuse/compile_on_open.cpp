// Compile-on-open (compile_on_open.hpp).
#include "compile_on_open.hpp"

#include "cache_policy.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include <fmt/format.h>

#include <neffcache/cache/layout.hpp>
#include <neffcache/compile/prepare.hpp>
#include <neffcache/store/scheduling.hpp>

#include "caller.hpp"
#include "entry_view.hpp"
#include "inode_table.hpp"

namespace neffcachefs {

using namespace neffcache;

// With an S3 cache: scheduler workers beyond the compile slots, for fetches.
constexpr int k_fetch_lanes = 4;

bool PrepareQueue::push(Item item) {
  {
    std::lock_guard lk(mu_);
    if (stop_) return false;
    item.seq = pushed_++;
    items_.push_back(std::move(item));
  }
  cv_.notify_one();
  return true;
}

std::optional<PrepareQueue::Item> PrepareQueue::pop() {
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return stop_ || !items_.empty(); });
  if (stop_) return std::nullopt;
  Item item = std::move(items_.front());
  items_.pop_front();
  return item;
}

uint64_t PrepareQueue::pushed() {
  std::lock_guard lk(mu_);
  return pushed_;
}

std::vector<std::shared_ptr<Waiter>> PrepareQueue::take_waiters(const std::string& entry_dir, uint64_t before) {
  std::vector<std::shared_ptr<Waiter>> taken;
  std::lock_guard lk(mu_);
  std::erase_if(items_, [&](Item& item) {
    if (!item.waiter || item.entry_dir != entry_dir || item.seq >= before) return false;
    taken.push_back(std::move(item.waiter));
    return true;
  });
  return taken;
}

std::deque<PrepareQueue::Item> PrepareQueue::stop(bool& first) {
  std::deque<Item> left;
  {
    std::lock_guard lk(mu_);
    first = !stop_;
    if (!first) return left;
    stop_ = true;
    left.swap(items_);
  }
  cv_.notify_all();
  return left;
}

void Deadlines::start(Expire expire) {
  expire_ = std::move(expire);
  thread_ = std::thread([this] { loop(); });
}

void Deadlines::add(Clock::time_point at, const std::shared_ptr<Waiter>& w) {
  std::lock_guard lk(mu_);
  auto it = deadlines_.emplace(at, w);
  if (it == deadlines_.begin()) cv_.notify_one();
}

void Deadlines::stop() {
  {
    std::lock_guard lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::size_t Deadlines::pending() {
  std::lock_guard lk(mu_);
  return deadlines_.size();
}

void Deadlines::loop() {
  std::unique_lock lk(mu_);
  while (!stop_) {
    if (deadlines_.empty()) {
      cv_.wait(lk);
      continue;
    }
    auto first = deadlines_.begin();
    if (first->first > Clock::now()) {
      cv_.wait_until(lk, first->first);
      continue;
    }
    auto w = first->second.lock();  // empty: answered and released meanwhile
    deadlines_.erase(first);
    if (!w) continue;
    lk.unlock();
    expire_(w);
    lk.lock();
  }
}

void CompileOnOpen::start() {
  Scheduler::Options so = opts_.scheduler;
  // A store with a compile of its own (the local tier over S3) limits compiles to its
  // slots (as many as --jobs); the extra workers fetch done entries and wait on other
  // hosts' leases meanwhile.
  if (opts_.store->compile_function()) so.jobs += k_fetch_lanes;
  neffcache::store::compile_through(*opts_.store, so);
  scheduler_ = std::make_unique<Scheduler>(so);
  prep_thread_ = std::thread([this] { prepare_loop(); });
  if (opts_.wait_timeout.count() > 0)
    deadlines_.start([this](const std::shared_ptr<Waiter>& w) { answer(w, nullptr, ETIMEDOUT); });
}

void CompileOnOpen::shutdown() {
  bool first = false;
  auto left = queue_.stop(first);
  if (!first) return;
  if (prep_thread_.joinable()) prep_thread_.join();
  deadlines_.stop();
  // Work never handed to the scheduler still has waiters to answer.
  for (auto& item : left)
    if (item.waiter) answer(item.waiter, nullptr, EIO);
  if (scheduler_) scheduler_->shutdown();
}

// An interrupt of a waiting open (libfuse calls it at once if the request was
// interrupted before it was registered).
static void on_interrupt(void* data) {
  auto* w = static_cast<Waiter*>(data);
  // The waiter is alive: the pending compile's callback holds it until it is answered.
  std::shared_ptr<Waiter> alias(std::shared_ptr<Waiter>(), w);
  w->owner->answer(alias, nullptr, EINTR);
}

Answer<fuse_file_info> CompileOnOpen::open(const Caller& caller, fuse_ino_t ino, fuse_ino_t parent, const std::string& name,
                                           int dir_fd, const fuse_file_info& fi) {
  int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {  // produced meanwhile
    fuse_file_info opened = fi;
    opened.fh = static_cast<uint64_t>(fd);
    set_open_caching(opened, NodeKind::placeholder, true);
    return opened;
  }
  // The entry as its lookup judged it, by the same rule (entry_view.hpp): a failure may
  // have been recorded since.
  // (`dir_fd` is layer 0's copy of the entry: a placeholder's open compiles or finishes there.)
  auto look = look_at(dir_fd, opts_.compiler_dir, /*writable=*/true);
  if (look && placeholder_open(look->stage, opts_.retry_failed) == PlaceholderOpen::fail_recorded) {
    stats_.eio(EioSite::failed_cached,
               fmt::format("{}: a failed compile is recorded ({})", look->path, failure_record(look->path)));
    return Errno{EIO};
  }
  std::string entry = look ? std::move(look->path) : path_of_fd(dir_fd);
  auto w = std::make_shared<Waiter>();
  w->owner = this;
  w->later = caller.keep();
  w->ino = ino;
  w->parent = parent;
  w->name = name;
  w->entry = entry;
  w->parent_fd = detail::UniqueFd(::dup(dir_fd));
  w->fi = fi;
  ++stats_.waiters;
  w->later->on_interrupt(on_interrupt, w.get());
  if (opts_.wait_timeout.count() > 0) deadlines_.add(Deadlines::Clock::now() + opts_.wait_timeout, w);
  request(entry, Priority::waiting, w);
  return Deferred{};
}

void CompileOnOpen::answer(const std::shared_ptr<Waiter>& w, const CompileResult* result, int err) {
  if (w->answered.exchange(true)) return;
  --stats_.waiters;
  if (err == EINTR) ++stats_.interrupted;
  if (err == ETIMEDOUT) {
    stats_.eio(EioSite::wait_deadline,
               fmt::format("{}/{}: no compile result within --wait-timeout {} s; the compile goes on", w->entry, w->name,
                           std::chrono::duration<double>(opts_.wait_timeout).count()));
    return w->later->fail(EIO);
  }
  if (!result) return w->later->fail(err);
  if (result->refused) {
    ++stats_.refused;
    stats_.eio(EioSite::compile_refused, fmt::format("{}/{}: {}", w->entry, w->name, result->message));
    return w->later->fail(EIO);
  }
  if (!is_success(result->outcome)) {
    bool recorded = result->outcome == CompileOutcome::failed || result->outcome == CompileOutcome::failed_cached;
    stats_.eio(recorded ? EioSite::compile_failed : EioSite::compile_transient,
               fmt::format("{}/{}: {} ({})", w->entry, w->name, to_string(result->outcome), result->message));
    return w->later->fail(EIO);
  }
  int fd = ::openat(w->parent_fd.get(), w->name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    stats_.eio(EioSite::publish_vanished,
               fmt::format("{}/{}: compiled but cannot be opened: {}", w->entry, w->name, std::strerror(errno)));
    return w->later->fail(EIO);
  }
  fuse_file_info fi = w->fi;
  fi.fh = static_cast<uint64_t>(fd);  // the kernel's from the reply on (closed at its release)
  // The kernel holds a zero-size placeholder: read through direct I/O, and drop its
  // cached attributes and name so that later lookups find the real file.
  set_open_caching(fi, NodeKind::placeholder, true);
  stats_.opened_entry(w->entry);
  w->later->opened(fi);
  notify_produced(session_, w->ino, w->parent, w->name);
}

void CompileOnOpen::request(const std::string& entry_dir, Priority prio, std::shared_ptr<Waiter> waiter,
                            bool upload_only) {
  if (queue_.push({entry_dir, prio, waiter, upload_only})) return;
  if (waiter) answer(waiter, nullptr, EIO);
}

void CompileOnOpen::prepare_loop() {
  while (auto item = queue_.pop()) {
    if (item->upload_only) {
      auto up = opts_.store->remote().publish_written(item->entry_dir);
      if (!up) fmt::print(stderr, "neffcachefs: cannot upload {}: {}\n", item->entry_dir, up.error().message);
      continue;
    }
    // An entry of another compiler's folder is its client's (an eager compile of one
    // would be refused: compiler_serves).
    if (!compiles_here(item->entry_dir, opts_.compiler_dir) && !item->waiter) continue;
    JobSpec spec = prepare_job(item->entry_dir, opts_.default_flags,
                               compiler_version(opts_.scheduler.settings).value_or(""));
    // Where each entry publishes its own NEFF (S3), no copies between equal graphs.
    if (!opts_.store->copies_equal_graphs()) spec.dedup_key.clear();
    // No lock is held here; the callback may run on this thread (see the header).
    scheduler_->submit(spec, item->prio, [this, w = item->waiter, entry = spec.entry_dir](const CompileResult& r) {
      // (The kernel forgets the folders first: a waiter answered may list them at once.)
      if (ended_) ended_(entry);
      if (w) answer(w, &r, 0);
      answer_queued(entry, r);
    });
  }
}

std::vector<std::shared_ptr<Waiter>> waiters_answered_by(PrepareQueue& queue, const std::string& entry_dir,
                                                         const CompileResult& r) {
  if (r.outcome == CompileOutcome::transient || r.outcome == CompileOutcome::busy) return {};  // they ask again
  // The mark first, the folder second: each waiter taken was waiting when the folder
  // still showed the result. One queued later goes the usual way (prepared and
  // submitted: answered at submit if the folder still shows it, else compiled anew).
  const uint64_t mark = queue.pushed();
  auto files = read_entry_files(entry_dir);
  if (!files || !shows_result(*files, r.outcome)) return {};
  return queue.take_waiters(entry_dir, mark);
}

void CompileOnOpen::answer_queued(const std::string& entry_dir, const CompileResult& r) {
  for (auto& w : waiters_answered_by(queue_, entry_dir, r)) answer(w, &r, 0);
}

}  // namespace neffcachefs
