// The cache's upkeep in the daemon, on a thread of its own. At start, the files of ours
// that earlier versions left inside LNL key folders are moved out of them
// (move_own_files_out, cache/maintenance.hpp). Then the content index's upkeep
// (cache/index.hpp): at start, a bounded scan
// that records the done and failed entries the index does not know yet (written by
// unmodified clients or other tools, or published before a crash); then every entry the
// daemon serves a hit from while the index does not know it. On a thread of its own:
// reading and hashing an HLO never happens in a handler, and opens are served while the
// scan runs. Results the daemon compiles or reuses are recorded by the scheduler itself.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include <neffcache/cache/index.hpp>

namespace neffcachefs {

class Indexer {
 public:
  // `root`: the folder the daemon writes (its layer 0; empty: none, a scratch folder over a
  // read-only cache). `index` may be null (a store without one, or the index turned off):
  // then only the start-up tidy runs. `scan_limit`: HLOs the start-up scan may read.
  Indexer(std::string root, const neffcache::ContentIndex* index, std::vector<std::string> default_flags,
          std::size_t scan_limit)
      : root_(std::move(root)), index_(index), default_flags_(std::move(default_flags)), scan_limit_(scan_limit) {}
  ~Indexer() { stop(); }
  Indexer(const Indexer&) = delete;
  Indexer& operator=(const Indexer&) = delete;

  void start();
  // Returns once the thread is gone; a scan in progress stops between entries.
  void stop();
  // A hit on the NEFF of the entry folder `entry_dir`: recorded soon if the index does
  // not know the entry. Costs a stat when it does.
  void seen(const std::string& entry_dir);
  // For stats.json: the scan's state and counts, entries recorded on sight.
  nlohmann::ordered_json stats() const;

 private:
  void run();

  const std::string root_;
  const neffcache::ContentIndex* index_;
  const std::vector<std::string> default_flags_;
  const std::size_t scan_limit_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  // Rank 70 (docs/ARCHITECTURE.md): guards queue_, queued_ and scan_. A leaf.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;  // entries (neuronxcc-*/MODULE_*) to record
  std::set<std::string> queued_;
  struct {
    const char* state = "not started";
    neffcache::IndexScan result;
  } scan_;
  std::atomic<std::size_t> added_on_sight_{0};
};

}  // namespace neffcachefs
