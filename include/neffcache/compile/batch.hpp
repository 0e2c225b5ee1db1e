// A batch of entries compiled through one scheduler, with the per-graph results a
// report needs: what `neffcache compile` and `neuron_parallel_compile` run. Entries
// may be added while earlier ones compile (graphs are compiled as they are extracted).
#pragma once

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <neffcache/compile/compile.hpp>
#include <neffcache/compile/prepare.hpp>
#include <neffcache/compile/scheduler.hpp>

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
  void add(const std::string& entry_dir, Priority priority = Priority::background) {
    const auto version = compiler_version(settings_);
    if (auto serves = compiler_serves(entry_dir, version, settings_.compiler.program()); !serves) {
      std::string folder = compiler_dir_of(entry_dir);
      bool first;
      {
        std::lock_guard lk(mu_);
        first = skipped_.insert(folder).second;
      }
      if (first && settings_.log) settings_.log(fmt::format("{} (every entry of {} is skipped)", serves.error().message, folder));
      return;
    }
    {
      std::lock_guard lk(mu_);
      if (!items_.try_emplace(entry_dir, Item{entry_dir, hlo_path_of(entry_dir), {}}).second) return;
      order_.push_back(entry_dir);
    }
    scheduler_.submit(prepare_job(entry_dir, default_flags_, version.value_or("")), priority,
                      [this, entry_dir](const CompileResult& r) {
                        std::lock_guard lk(mu_);
                        items_.at(entry_dir).result = r;
                        ++finished_;
                        (is_success(r.outcome) ? done_ : failed_) += 1;
                        cv_.notify_all();
                      });
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

  Counts counts() const {
    auto p = scheduler_.progress();
    std::lock_guard lk(mu_);
    Counts c;
    c.total = order_.size();
    c.done = done_;
    c.failed = failed_;
    // The scheduler knows which unfinished entries wait on another process's lock.
    c.locked = std::min(p.locked, c.total - finished_);
    c.remaining = c.total - finished_ - c.locked;
    return c;
  }

  // Every entry in the order added, with its result once it has one.
  std::vector<Item> items() const {
    std::lock_guard lk(mu_);
    std::vector<Item> out;
    for (const auto& e : order_) out.push_back(items_.at(e));
    return out;
  }

  // Stops: queued work ends as transient failures, running compiles are stopped.
  void shutdown() { scheduler_.shutdown(); }

 private:
  static std::string hlo_path_of(const std::string& entry_dir) {
    // (An entry not in a folder here, an S3 one, is named by its dialect's usual input.)
    auto files = read_entry_files(entry_dir);
    std::string_view name = files && files->hlo_name()                       ? *files->hlo_name()
                            : EntryFiles::of_entry_path(entry_dir).is_lnl() ? k_lnl_hlo_file
                                                                             : k_hlo_module_file;
    return fmt::format("{}/{}", entry_dir, name);
  }

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
inline nlohmann::ordered_json neuron_report(const std::vector<Batch::Item>& items,
                                            std::chrono::system_clock::time_point start, double seconds) {
  nlohmann::ordered_json summary = nlohmann::ordered_json::object(), report = nlohmann::ordered_json::object();
  for (const auto& item : items) {
    if (!item.result) continue;
    bool ok = is_success(item.result->outcome);
    std::string status = ok ? "true" : "false";
    summary[status] = summary.value(status, 0) + 1;
    report[item.hlo_path] = {{"status", ok},
                             {"retry", std::max(0, item.result->attempts - 1)},
                             {"compile_time", std::round(item.result->compile_seconds * 100) / 100}};
  }
  return {{"compilation_summary", summary},
          {"compilation_report", report},
          {"start_time", std::chrono::duration<double>(start.time_since_epoch()).count()},
          {"compilation_time", seconds}};
}

}  // namespace neffcache
