// A batch of entries compiled through one scheduler, with the per-graph results a
// report needs: what `neffcache compile` and `neuron_parallel_compile` run. Entries
// may be added while earlier ones compile (graphs are compiled as they are extracted).
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <neffcache/compile/compile.hpp>
#include <neffcache/compile/prepare.hpp>
#include <neffcache/compile/scheduler.hpp>
#include <neffcache/core/decl.hpp>

namespace neffcache {

class Batch {
 public:
  struct Item {
    std::string entry_dir;
    std::string hlo_path;  // the report's key, as the Neuron tool names a graph
    std::optional<CompileResult> result;
  };

  struct Counts {
    std::size_t total = 0;      // entries added
    std::size_t remaining = 0;  // queued or compiling here
    std::size_t locked = 0;     // being compiled by another process; we wait for it
    std::size_t done = 0;       // finished with a NEFF
    std::size_t failed = 0;     // finished without one (transient failures included)
  };

  Batch(Scheduler::Options opts, std::vector<std::string> default_flags)
      : default_flags_(std::move(default_flags)), settings_(opts.settings), scheduler_(std::move(opts)) {}
  ~Batch() { scheduler_.shutdown(); }
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // Adds an entry folder and submits its compile at `priority` (deferred: after the
  // other work, see Priority); adding one twice does nothing. Reads the entry's HLO (for
  // the job's size and dedup key), so it may take a moment. An entry whose folder names
  // another compiler (compiler_serves) is skipped: not added, with one line in the
  // settings' log for the first of each compiler folder.
  void add(const std::string& entry_dir, Priority priority = Priority::background) { submit(entry_dir, priority, false); }

  // The same, and an entry whose result was delivered already is submitted again, that
  // result taken back (a compile farm that finds it needs a compile again: its failure
  // cleared, its NEFF removed, a transient end). An entry still in the works is left alone.
  void add_again(const std::string& entry_dir, Priority priority = Priority::background) {
    submit(entry_dir, priority, true);
  }

  // Blocks until every entry added so far has a result, or `until` passes; true when all have.
  bool wait_until(std::chrono::steady_clock::time_point until) {
    std::unique_lock lk(mu_);
    return cv_.wait_until(lk, until, [&] { return finished_ == order_.size(); });
  }
  void wait() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return finished_ == order_.size(); });
  }

  Counts counts() const;

  // Every entry in the order added, with its result once it has one.
  std::vector<Item> items() const;

  // Stops: queued work ends as transient failures, running compiles are stopped.
  void shutdown() { scheduler_.shutdown(); }

 private:
  static std::string hlo_path_of(const std::string& entry_dir);
  void submit(const std::string& entry_dir, Priority priority, bool again);

  std::vector<std::string> default_flags_;
  const CompileSettings settings_;  // the scheduler's: which entries its compiler may compile
  mutable std::mutex mu_;  // guards the members below; never held while calling the scheduler
  std::set<std::string> skipped_;  // compiler folders whose entries were skipped
  std::condition_variable cv_;
  std::map<std::string, Item> items_;
  std::vector<std::string> order_;
  std::size_t finished_ = 0, done_ = 0, failed_ = 0;
  Scheduler scheduler_;  // last: its workers call back into the members above
};

// The report the Neuron tool prints and dumps after a run: per graph (its HLO path) the
// status, the retries made and the compile time; the counts by status; when the run
// started (seconds since the epoch) and how long it took. Entries without a result yet
// are left out.
NEFFCACHE_DECL nlohmann::ordered_json neuron_report(const std::vector<Batch::Item>& items,
                                                    std::chrono::system_clock::time_point start, double seconds);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/batch.ipp>
#endif
