// Statistics of the daemon: counters, the numbered EIO sites, and the snapshots of
// stats.json that open files of it read.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <neffcache/cache/layout.hpp>
#include <neffcache/compile/scheduler.hpp>

namespace neffcachefs {

// Numbered EIO sites (greppable in the log, counted in the statistics).
enum class EioSite : int {
  compile_failed = 1,   // the compiler failed (deterministic): model.log recorded
  compile_transient,    // killed, timed out, shut down: the next open tries again
  failed_cached,        // a failure is recorded; open fails at once until retried
  publish_vanished,     // the NEFF was published but could not be opened
  wait_deadline,        // the wait outlasted --wait-timeout; the compile goes on
  promote_failed,       // a folder renamed to an LNL key could not be published to S3
  compile_refused,      // a miss while compiles are off (--no-compile, a read-only cache), or of
                        // another compiler's folder (compiler_serves)
  count
};

class Stats {
 public:
  // Name of the hidden folder at the mount root that holds stats.json (not in the backing).
  static constexpr const char* k_dir = ".neffcache";
  static constexpr const char* k_file = "stats.json";

  std::atomic<uint64_t> hits{0};         // opens of a finished model.neff
  std::atomic<uint64_t> misses{0};       // opens that needed a compile (or joined one)
  std::atomic<uint64_t> refused{0};      // misses refused because compiles are off
  std::atomic<uint64_t> waiters{0};      // opens waiting for a compile now
  std::atomic<uint64_t> interrupted{0};  // waits ended by an interrupt
  std::atomic<uint64_t> read_bytes{0};   // bytes asked for by reads, and the sizes of passthrough opens
  std::atomic<uint64_t> reads{0};        // READ requests answered (none for a passthrough open)

  // A reader got the NEFF of the entry folder `entry_dir` (a hit, or an open answered
  // once its compile or fetch was done): stats.json lists those entries under "opened",
  // by their path in the cache, which `neffcache manifest` turns into what a warm start
  // of another host fetches. At most k_max_opened are kept.
  static constexpr std::size_t k_max_opened = 100000;
  void opened_entry(const std::string& entry_dir);

  // Counts an EIO at `site` and logs it as "EIO (NN) what".
  void eio(EioSite site, const std::string& what);
  uint64_t eio_count(EioSite site) const { return eio_counts_[static_cast<int>(site)].load(); }

  // What stats.json shows besides the counters.
  struct Context {
    neffcache::Progress progress;
    int jobs = 0;
    std::string mountpoint;
    std::string backing;
    std::vector<std::string> layers;  // the read-only layers under `backing` (layers.hpp)
    bool read_only = false;           // a read-only cache without --upper: nothing may change
    std::optional<nlohmann::ordered_json> s3;  // the tier's statistics, url included
    nlohmann::ordered_json index;              // the content index's upkeep (Indexer::stats)
    nlohmann::ordered_json memory;             // admission by memory (Filesystem::stats_json)
    nlohmann::ordered_json passthrough;        // FUSE passthrough (passthrough.hpp)
    // `backing`, then `layers`: where an entry folder may be.
    std::vector<std::string> layer_roots() const {
      std::vector<std::string> out{backing};
      out.insert(out.end(), layers.begin(), layers.end());
      return out;
    }
  };
  // The counters as stats.json shows them (and the metrics are read from: --metrics-file).
  // Without `with_opened`, the list of opened entries is left out (the metrics need none of it,
  // and every hit takes its lock).
  nlohmann::ordered_json document(const Context& ctx, bool with_opened = true) const;
  std::string json(const Context& ctx) const { return document(ctx).dump(2) + "\n"; }

  // Snapshots of stats.json, one per open: a reader that takes it in several reads gets
  // one document, not pieces of two (a counter that gains a digit shifts them). Owned
  // here, not by the handle: a daemon stopped before the kernel sent an open's RELEASE
  // frees them all the same. open_snapshot returns the handle (fh).
  uint64_t open_snapshot(std::string text);
  // A copy this thread owns: the reply wakes the client, whose close may free the
  // snapshot on another thread before the write of the reply has returned.
  std::string read_snapshot(uint64_t fh, std::size_t size, std::size_t off);
  void release_snapshot(uint64_t fh);

 private:
  std::atomic<uint64_t> eio_counts_[static_cast<int>(EioSite::count)] = {};
  // Rank 70 (docs/ARCHITECTURE.md): guards snapshots_ and next_snapshot_. A leaf.
  std::mutex snapshots_mu_;
  std::map<uint64_t, std::string> snapshots_;
  uint64_t next_snapshot_ = 0;
  // Rank 70 as well, never held with snapshots_mu_: guards opened_. A leaf.
  mutable std::mutex opened_mu_;
  std::set<std::string> opened_;  // entry folders (opened_entry)
};

}  // namespace neffcachefs
