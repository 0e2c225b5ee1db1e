// The compile scheduler: at most `jobs` compiles at once; one job per entry however many
// ask (single flight); one compile for entries whose canonical graph, flags and
// compiler are equal, and none for an entry whose equal graph has a result already (the
// content index, asked through Options::reuse); waited-on work first, then the largest graph;
// and, given a memory ledger (compile/memory.hpp), a compile starts only once its predicted
// peak (compile/peaks.hpp) fits in the host's budget.
//
// A job engine: it reads no entry itself. What an entry's job is (its size and dedup
// key) comes with submit (see prepare_job in compile/prepare.hpp for an entry folder);
// whether an entry is settled already, how it is compiled and how a result is copied
// come from Options. The defaults are the directory cache's rules.
//
// Admission by memory: the best queued job starts when its reservation fits beside what
// the host holds (or when the host holds nothing: a graph larger than the budget still
// compiles, alone). When it does not fit, a smaller job may pass it if it fits now and
// would fit beside it too (so it never is what keeps the waiting job from starting once
// the others end), at most Options::max_bypass times; then nothing more starts here until
// it fits. Between processes, through the ledger: while another process's best job has
// waited longer than ours, only what leaves room for it starts here. A compile killed
// for lack of memory is queued again with a larger reservation (oom_reservation), up to
// Options::max_oom_retries times, and never recorded as a failure.
//
// Lock order: Scheduler::mu_, then the ledger's own lock (an admission is decided under
// both); mu_ is never held while a compile, a copy or a callback runs.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <neffcache/compile/compile.hpp>
#include <neffcache/compile/memory.hpp>
#include <neffcache/compile/peaks.hpp>
#include <neffcache/compile/twin.hpp>
#include <neffcache/core/clock.hpp>
#include <neffcache/core/decl.hpp>

namespace neffcache {

inline constexpr uint64_t k_default_mem_per_job = 64ull << 30;  // what one neuronx-cc may need
inline constexpr std::chrono::milliseconds k_busy_retry{1000};  // re-check an entry locked elsewhere

// min(cores, ceil(RAM / mem_per_job)), at least 1: how the Neuron tool sizes its pool.
NEFFCACHE_DECL int default_jobs(uint64_t mem_per_job = k_default_mem_per_job);

// What the scheduler needs to know about an entry before compiling it.
struct JobSpec {
  std::string entry_dir;
  // Entries with equal keys compile once. Empty: the entry is its own key.
  std::string dedup_key;
  uint64_t instructions = 0;  // larger graphs go first
  uint64_t hlo_bytes = 0;     // with instructions, what a peak is predicted from
};

// The reservation of a compile again after it was killed for lack of memory: twice what
// it had, or half again the peak it reached, whichever is larger.
inline uint64_t oom_reservation(uint64_t reserved, uint64_t peak_bytes) {
  return std::max(2 * reserved, peak_bytes + peak_bytes / 2);
}

// The order in which queued work is taken: waited-on work first, then background work,
// then deferred work (work another process is expected to take first, e.g. another
// node's share of a multi-node compile, taken when nothing else is left here).
enum class Priority { deferred, background, waiting };

struct Progress {
  std::size_t queued = 0;   // waiting for a compile slot
  std::size_t running = 0;  // compiling now
  std::size_t locked = 0;   // held by another process; re-checked every busy_retry
  std::size_t done = 0;     // entries finished with a NEFF
  std::size_t failed = 0;   // entries finished without one
  std::size_t total = 0;    // entries ever submitted
  // Compiler runs (copies to equal entries are not compiles).
  std::size_t compiles_started = 0, compiles_succeeded = 0, compiles_failed = 0, compiles_transient = 0;
  double compile_seconds = 0;
  // Entries given the result of an equal graph found in the content index, and the
  // compile time those results took (what was saved).
  std::size_t twins_served = 0;
  double twin_seconds_saved = 0;
  // Admission by memory: compiles killed for lack of memory (each queued again with a
  // larger reservation), what this scheduler's running compiles have reserved, and
  // whether the best queued job waits for memory rather than for a compile slot.
  std::size_t oom_kills = 0;
  uint64_t memory_reserved = 0;
  bool waiting_for_memory = false;
  std::size_t remaining() const { return queued + running + locked; }
};

class Scheduler {
 public:
  using Callback = std::function<void(const CompileResult&)>;

  struct Options {
    int jobs = default_jobs();
    CompileSettings settings;
    std::chrono::milliseconds busy_retry = k_busy_retry;
    const Clock* clock = &system_clock();
    // Compiles one entry: compile_entry on an entry folder when empty. Entries of another
    // store (an S3 cache) come with their own, and name entries in their own way.
    std::function<CompileResult(const std::string& entry, const CompileSettings&)> compile;
    // Whether an entry is settled already (done, or a failure kept): such an entry is
    // answered at submit and takes no worker. Empty: every entry goes to a worker, whose
    // compile finds out. The default is the directory cache's rule (folder_settled), so
    // that callers naming entry folders keep it without saying so; callers whose entries
    // are not folders set their own, or none.
    std::function<std::optional<CompileOutcome>(const std::string& entry, const CompileSettings&)> settled =
        folder_settled;
    // A result an equal graph already has (the content index), asked with the job's
    // dedup key before the job is queued and again before it is compiled: a result ends
    // the job without a compile; nullopt compiles. Empty: never. The default is the
    // directory cache's index (folder_reuse); callers whose entries are not folders set
    // their own, or none.
    std::function<std::optional<CompileResult>(const std::string& entry, const std::string& key,
                                               const CompileSettings&)>
        reuse = [](const std::string& entry, const std::string& key, const CompileSettings& s) {
          return folder_reuse(entry, key, s);
        };
    // Records a result delivered to an entry (the content index), before its callbacks
    // run. Empty: nothing is recorded.
    std::function<void(const std::string& entry, const std::string& key, const CompileResult&, const CompileSettings&)>
        record = [](const std::string& entry, const std::string& key, const CompileResult& r,
                    const CompileSettings& s) { folder_record(entry, key, r, s); };
    // The host's memory ledger: each compile reserves its predicted peak there first.
    // Null: compiles are admitted by count (jobs) only.
    std::shared_ptr<MemoryLedger> memory;
    // Peaks of earlier compiles, to predict from and to add to. Null with a ledger: every
    // graph is predicted PeakHistory's default for a graph never seen.
    std::shared_ptr<PeakHistory> peaks;
    // How often a job waiting for memory may be passed by smaller ones (0: jobs times).
    int max_bypass = 0;
    // Compiles of one job killed for lack of memory before it ends as a transient failure.
    int max_oom_retries = 3;
  };

  explicit Scheduler(Options o);
  ~Scheduler() { shutdown(); }
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Asks for an entry. Joins the job already queued or running for this entry (or for
  // an entry with the same dedup key) whose result is not yet delivered; a waiting
  // request lifts a queued job ahead of background work. `done` runs once with this
  // entry's result: on a scheduler thread, or on the calling thread before submit
  // returns when the answer is known at submit (a settled entry, a scheduler shut
  // down). So the caller must not hold, while it calls submit, a lock that `done` takes.
  std::shared_future<CompileResult> submit(const JobSpec& spec, Priority priority, Callback done = {});

  Progress progress() const;

  // Blocks until nothing is queued, running or locked.
  void wait_idle() {
    std::unique_lock lk(mu_);
    idle_cv_.wait(lk, [&] { return by_entry_.empty(); });
  }

  // Queued and locked work ends as transient failures; running compiles are stopped
  // (their result: transient, "cancelled"). Returns when every worker has exited.
  void shutdown();

 private:
  struct Target {
    explicit Target(std::string e) : entry(std::move(e)), future(promise.get_future().share()) {}
    std::string entry;
    std::promise<CompileResult> promise;
    std::shared_future<CompileResult> future;
    std::vector<Callback> callbacks;      // guarded by mu_ until result is set
    std::optional<CompileResult> result;  // set under mu_ when delivered
  };

  struct Job {
    enum class State { queued, running, locked };
    std::string key;
    std::vector<std::unique_ptr<Target>> targets;  // targets[0] is compiled, the rest copied
    Priority priority = Priority::background;
    uint64_t instructions = 0;
    uint64_t seq = 0;
    State state = State::queued;
    // Admission by memory: the predicted peak (for the history's version it was made
    // with), the floor a kill for lack of memory set, the reservation while running, and
    // how often smaller jobs passed it while it waited.
    uint64_t hlo_bytes = 0;
    uint64_t predicted = 0, predicted_version = UINT64_MAX, oom_floor = 0, reserved = 0, reservation_id = 0;
    int oom_kills = 0, bypassed = 0;
    bool finishing = false;  // result known: new equal-key requests start a new job
    Clock::time_point retry_at{};

    Target* target(const std::string& entry) {
      for (auto& t : targets)
        if (t->entry == entry) return t.get();
      return nullptr;
    }
  };

  // Waiting before background before deferred, then larger graphs, then first come first served.
  struct Order {
    bool operator()(const Job* a, const Job* b) const {
      if (a->priority != b->priority) return a->priority > b->priority;
      if (a->instructions != b->instructions) return a->instructions > b->instructions;
      return a->seq < b->seq;
    }
  };

  // Counts a result delivered to one entry. Caller holds mu_.
  void count_delivered(const CompileResult& r);

  // A result known at submit: delivered at once.
  static std::shared_future<CompileResult> answered(const CompileResult& r, const Callback& done);

  // Re-sorts a queued job whose priority or size grew. Caller holds mu_.
  void raise(Job& job, Priority priority, uint64_t instructions);

  void work();

  // What a job is expected to need: its predicted peak, at least what a kill for lack of
  // memory asked for. Caller holds mu_.
  uint64_t need(Job& job);

  // The queued job to start now, its memory reserved; null when none may start yet.
  // Caller holds mu_.
  Job* admit();

  // Delivers the primary's result and gives every other target its copy. Targets that
  // join while copies are made are served too.
  void finish(const std::shared_ptr<Job>& job, const CompileResult& primary);

  Options opts_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  std::set<Job*, Order> ready_;                              // queued jobs, best first
  std::vector<std::shared_ptr<Job>> locked_;                 // busy elsewhere, retried later
  std::map<std::string, std::shared_ptr<Job>> by_key_;       // dedup key -> job
  std::map<std::string, std::shared_ptr<Job>> by_entry_;     // entry -> job, until delivered
  std::atomic<bool> stopping_{false};
  uint64_t next_seq_ = 0;
  std::size_t oom_kills_ = 0;
  uint64_t reserved_ = 0;  // by this scheduler's running compiles
  bool waiting_for_memory_ = false;
  std::size_t total_ = 0, done_ = 0, failed_ = 0;
  struct {
    std::size_t started = 0, succeeded = 0, failed = 0, transient = 0;
    double seconds = 0;
  } compiles_;
  struct {
    std::size_t served = 0;
    double seconds = 0;
  } twins_;
  std::vector<std::thread> workers_;
};

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/scheduler.ipp>
#endif
