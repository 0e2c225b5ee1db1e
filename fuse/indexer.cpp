// The daemon's upkeep of the content index (indexer.hpp).
#include "indexer.hpp"

#include <unistd.h>

#include <fmt/format.h>

#include <neffcache/cache/maintenance.hpp>
#include <neffcache/compile/twin.hpp>

namespace neffcachefs {

void Indexer::start() {
  if ((!index_ && root_.empty()) || thread_.joinable()) return;
  thread_ = std::thread([this] { run(); });
}

void Indexer::stop() {
  {
    // Under the lock: set between run()'s look at the flag and its wait, the notify would
    // be lost and the daemon would wait for this thread for ever at its stop (seen once
    // under TSan, the daemon hung at SIGTERM).
    std::lock_guard lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Indexer::seen(const std::string& entry_dir) {
  if (!index_ || stopping_) return;
  std::string entry = neffcache::entry_in_cache(entry_dir);
  if (index_->knows(entry)) return;
  std::lock_guard lk(mu_);
  if (!queued_.insert(entry).second) return;
  queue_.push_back(std::move(entry));
  cv_.notify_one();
}

nlohmann::ordered_json Indexer::stats() const {
  std::lock_guard lk(mu_);
  return {{"scan", scan_.state},
          {"scan_entries", scan_.result.entries},
          {"scan_added", scan_.result.added},
          {"scan_unreadable", scan_.result.unreadable},
          {"added_on_sight", added_on_sight_.load()}};
}

void Indexer::run() {
  if (!root_.empty())
    if (auto moved = neffcache::move_own_files_out(root_, [this] { return stopping_.load(); }))
      fmt::print(stderr, "neffcachefs: moved what an earlier version kept in {} LNL entries out of their folders\n",
                 moved);
  if (!index_) return;
  {
    std::lock_guard lk(mu_);
    scan_.state = "running";
  }
  auto scan = neffcache::index_unknown_entries(*index_, scan_limit_, default_flags_, [this] { return stopping_.load(); });
  {
    std::lock_guard lk(mu_);
    scan_.result = scan;
    scan_.state = scan.complete ? "done" : "cut short";
  }
  if (scan.added > 0 || !scan.complete) {
    // Say why it stopped: only the limit is the user's to raise (the rest is read at the
    // next start either way).
    std::string why;
    if (scan.stopped) why = " (the scan stopped: the daemon is shutting down)";
    else if (!scan.complete) why = fmt::format(" (stopped after {} HLO reads: see --index-scan)", scan_limit_);
    fmt::print(stderr, "neffcachefs: content index: {} entries recorded at start{}\n", scan.added, why);
  }
  std::unique_lock lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    std::string entry = std::move(queue_.front());
    queue_.pop_front();
    lk.unlock();
    const std::string dir = index_->entry_dir(entry);
    if (!index_->knows(entry))
      if (auto id = neffcache::entry_content_id(dir, default_flags_); id && index_->add(*id, entry))
        ++added_on_sight_;
    lk.lock();
    queued_.erase(entry);
  }
}

}  // namespace neffcachefs
