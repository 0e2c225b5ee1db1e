// Definitions of compile/scheduler.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/scheduler.hpp>

#include <unistd.h>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL int default_jobs(uint64_t mem_per_job) {
  long cores = ::sysconf(_SC_NPROCESSORS_ONLN);
  uint64_t ram = static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  uint64_t by_mem = mem_per_job ? (ram + mem_per_job - 1) / mem_per_job : static_cast<uint64_t>(cores);
  return static_cast<int>(
      std::max<uint64_t>(1, std::min<uint64_t>(static_cast<uint64_t>(std::max(1L, cores)), by_mem)));
}

NEFFCACHE_DECL Scheduler::Scheduler(Options o) : opts_(std::move(o)) {
  opts_.jobs = std::max(1, opts_.jobs);
  if (opts_.max_bypass <= 0) opts_.max_bypass = opts_.jobs;
  if (opts_.memory && !opts_.peaks) opts_.peaks = std::make_shared<PeakHistory>();
  // Running compiles stop (as transient failures) once shutdown() is called.
  auto outer = opts_.settings.cancelled;
  opts_.settings.cancelled = [this, outer] { return stopping_.load() || (outer && outer()); };
  for (int i = 0; i < opts_.jobs; ++i) workers_.emplace_back([this] { work(); });
}

NEFFCACHE_DECL std::shared_future<CompileResult> Scheduler::submit(const JobSpec& spec, Priority priority,
                                                                   Callback done) {
  // An entry already settled takes no worker: behind a queue of compiles, its answer
  // would wait for one.
  if (opts_.settled)
    if (auto o = opts_.settled(spec.entry_dir, opts_.settings)) {
      {
        std::lock_guard lk(mu_);
        ++total_;
        ++(is_success(*o) ? done_ : failed_);
      }
      return answered(CompileResult::of(*o, ""), done);
    }
  // An equal graph's result, when the index has one: no worker either.
  if (opts_.reuse && !spec.dedup_key.empty() && !stopping_)
    if (auto r = opts_.reuse(spec.entry_dir, spec.dedup_key, opts_.settings)) {
      {
        std::lock_guard lk(mu_);
        ++total_;
        count_delivered(*r);
      }
      if (opts_.record) opts_.record(spec.entry_dir, spec.dedup_key, *r, opts_.settings);
      return answered(*r, done);
    }
  std::unique_lock lk(mu_);
  if (stopping_) {
    lk.unlock();
    return answered(CompileResult::of(CompileOutcome::transient, "scheduler is shut down"), done);
  }
  std::shared_ptr<Job> job;
  if (auto it = by_entry_.find(spec.entry_dir); it != by_entry_.end()) {
    Target& t = *it->second->target(spec.entry_dir);
    // Joins work not yet delivered. A request after delivery is a new request: its
    // caller may have acted on the result (cleared a failure, say), so it must not
    // get the old one; it starts a new job below.
    if (!t.result) {
      if (done) t.callbacks.push_back(std::move(done));
      raise(*it->second, priority, spec.instructions);
      return t.future;
    }
  }
  ++total_;
  std::string key = spec.dedup_key.empty() ? "entry:" + spec.entry_dir : spec.dedup_key;
  if (auto it = by_key_.find(key); it != by_key_.end() && !it->second->finishing) {
    job = it->second;
  } else {
    job = std::make_shared<Job>();
    job->key = key;
    job->seq = next_seq_++;
    job->priority = priority;
    job->instructions = spec.instructions;
    job->hlo_bytes = spec.hlo_bytes;
    by_key_[key] = job;
    ready_.insert(job.get());
  }
  auto& t = job->targets.emplace_back(std::make_unique<Target>(spec.entry_dir));
  if (done) t->callbacks.push_back(std::move(done));
  by_entry_[spec.entry_dir] = job;
  raise(*job, priority, spec.instructions);
  cv_.notify_one();
  return t->future;
}

NEFFCACHE_DECL Progress Scheduler::progress() const {
  std::lock_guard lk(mu_);
  Progress p;
  p.total = total_;
  p.done = done_;
  p.failed = failed_;
  p.compiles_started = compiles_.started;
  p.compiles_succeeded = compiles_.succeeded;
  p.compiles_failed = compiles_.failed;
  p.compiles_transient = compiles_.transient;
  p.compile_seconds = compiles_.seconds;
  p.twins_served = twins_.served;
  p.twin_seconds_saved = twins_.seconds;
  p.oom_kills = oom_kills_;
  p.memory_reserved = reserved_;
  p.waiting_for_memory = waiting_for_memory_;
  for (const auto& [entry, job] : by_entry_) {
    if (job->state == Job::State::running) ++p.running;
    else if (job->state == Job::State::locked) ++p.locked;
    else ++p.queued;
  }
  return p;
}

NEFFCACHE_DECL void Scheduler::shutdown() {
  std::vector<std::shared_ptr<Job>> dropped;
  {
    std::lock_guard lk(mu_);
    if (stopping_.exchange(true)) {
      if (workers_.empty()) return;
    }
    for (auto* j : ready_) dropped.push_back(by_key_.at(j->key));
    for (auto& j : locked_) dropped.push_back(j);
    ready_.clear();
    locked_.clear();
  }
  cv_.notify_all();
  for (auto& j : dropped) finish(j, CompileResult::of(CompileOutcome::transient, "scheduler is shut down"));
  for (auto& w : workers_) w.join();
  workers_.clear();
}

NEFFCACHE_DECL void Scheduler::count_delivered(const CompileResult& r) {
  if (is_success(r.outcome)) ++done_;
  else if (r.outcome == CompileOutcome::failed || r.outcome == CompileOutcome::failed_cached) ++failed_;
  if (!r.twin.empty() && r.outcome == CompileOutcome::success) {
    ++twins_.served;
    twins_.seconds += r.saved_seconds;
  }
}

NEFFCACHE_DECL std::shared_future<CompileResult> Scheduler::answered(const CompileResult& r, const Callback& done) {
  if (done) done(r);
  std::promise<CompileResult> p;
  p.set_value(r);
  return p.get_future().share();
}

NEFFCACHE_DECL void Scheduler::raise(Job& job, Priority priority, uint64_t instructions) {
  if (priority <= job.priority && instructions <= job.instructions) return;
  bool queued = job.state == Job::State::queued && ready_.erase(&job);
  job.priority = std::max(job.priority, priority);
  job.instructions = std::max(job.instructions, instructions);
  if (queued) ready_.insert(&job);
}

NEFFCACHE_DECL void Scheduler::work() {
  std::unique_lock lk(mu_);
  for (;;) {
    // Locked jobs whose retry time has come go back to the queue.
    auto now = opts_.clock->now();
    for (auto it = locked_.begin(); it != locked_.end();) {
      if ((*it)->retry_at <= now) {
        (*it)->state = Job::State::queued;
        ready_.insert(it->get());
        it = locked_.erase(it);
      } else {
        ++it;
      }
    }
    if (stopping_) return;
    if (ready_.empty()) {
      // Real time bounds the wait; the clock decides when a locked job is due.
      cv_.wait_for(lk, locked_.empty() ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(20));
      continue;
    }
    Job* next = opts_.memory ? admit() : *ready_.begin();
    if (!next) {
      // Nothing fits yet: woken by a release here; releases by other processes are
      // seen at the next look.
      cv_.wait_for(lk, std::chrono::milliseconds(250));
      continue;
    }
    ready_.erase(next);
    auto job = by_key_.at(next->key);
    job->state = Job::State::running;
    const std::string primary = job->targets.front()->entry;
    CompileSettings settings = opts_.settings;
    settings.predicted_peak_kib = job->reserved >> 10;
    settings.oom_retries = job->oom_kills;
    // Read under mu_: a joining request may raise the job's size meanwhile.
    const uint64_t instructions = job->instructions, hlo_bytes = job->hlo_bytes, reservation = job->reservation_id;
    lk.unlock();
    // The index again: an equal graph may have been compiled since the job was queued.
    std::optional<CompileResult> reused;
    if (opts_.reuse) reused = opts_.reuse(primary, job->key, settings);
    CompileResult r = reused           ? *reused
                      : opts_.compile ? opts_.compile(primary, settings)
                                      : compile_entry(primary, settings);
    if (opts_.memory) opts_.memory->release(reservation);
    if (r.attempts > 0 && r.peak_rss_kib > 0 && opts_.peaks &&
        (r.outcome == CompileOutcome::success || r.outcome == CompileOutcome::failed))
      opts_.peaks->add(job->key, instructions, hlo_bytes, static_cast<uint64_t>(r.peak_rss_kib));
    lk.lock();
    reserved_ -= job->reserved;
    job->reservation_id = 0;
    cv_.notify_all();  // memory came back: waiting workers look again
    if (r.attempts > 0) {
      ++compiles_.started;
      compiles_.seconds += r.compile_seconds;
      if (r.outcome == CompileOutcome::success) ++compiles_.succeeded;
      else if (r.outcome == CompileOutcome::failed) ++compiles_.failed;
      else ++compiles_.transient;
    }
    if (r.oom_killed && !stopping_) {
      ++oom_kills_;
      if (job->oom_kills < opts_.max_oom_retries) {
        ++job->oom_kills;
        job->oom_floor = oom_reservation(job->reserved, static_cast<uint64_t>(r.peak_rss_kib) << 10);
        job->reserved = 0;
        job->state = Job::State::queued;
        ready_.insert(job.get());
        continue;
      }
      r.message = fmt::format("{} ({} times; not recorded)", r.message, job->oom_kills + 1);
    }
    job->reserved = 0;
    if (r.outcome == CompileOutcome::busy && !stopping_) {
      job->state = Job::State::locked;
      job->retry_at = opts_.clock->now() + opts_.busy_retry;
      locked_.push_back(job);
      continue;
    }
    lk.unlock();
    finish(job, r);
    lk.lock();
  }
}

NEFFCACHE_DECL uint64_t Scheduler::need(Job& job) {
  if (job.predicted_version != opts_.peaks->version()) {
    job.predicted_version = opts_.peaks->version();
    job.predicted = opts_.peaks->predict(job.key, job.instructions, job.hlo_bytes).bytes;
  }
  return std::max(job.predicted, job.oom_floor);
}

NEFFCACHE_DECL Scheduler::Job* Scheduler::admit() {
  Job* head = *ready_.begin();
  Job* chosen = nullptr;
  uint64_t bytes = 0;
  const uint64_t budget = opts_.memory->budget();
  const uint64_t id = opts_.memory->admit([&](MemoryLedger::Admission& a) -> uint64_t {
    auto fits = [&](uint64_t n) { return a.fits(n, budget); };
    auto take = [&](Job* j, uint64_t n) { return chosen = j, bytes = n, a.what = j->targets.front()->entry, n; };
    const uint64_t head_needs = need(*head);
    if (fits(head_needs)) return take(head, head_needs);
    a.waiting = head_needs;
    if (head->bypassed >= opts_.max_bypass) return 0;
    // A job that would not fit beside the head would hold the head's room when the
    // others end: passing it would delay the head by a whole compile, again and again.
    for (Job* j : ready_)
      if (j != head)
        if (uint64_t n = need(*j); fits(n) && n + head_needs <= budget) return take(j, n);
    return 0;
  });
  waiting_for_memory_ = chosen != head;
  if (!chosen) return nullptr;
  if (chosen != head) ++head->bypassed;
  chosen->reserved = bytes;
  chosen->reservation_id = id;
  reserved_ += bytes;
  return chosen;
}

NEFFCACHE_DECL void Scheduler::finish(const std::shared_ptr<Job>& job, const CompileResult& primary) {
  std::size_t served = 0;
  for (;;) {
    Target* t;
    {
      std::lock_guard lk(mu_);
      job->finishing = true;
      if (served == job->targets.size()) {
        for (auto& target : job->targets)
          if (auto it = by_entry_.find(target->entry); it != by_entry_.end() && it->second == job) by_entry_.erase(it);
        if (auto it = by_key_.find(job->key); it != by_key_.end() && it->second == job) by_key_.erase(it);
        if (by_entry_.empty()) idle_cv_.notify_all();
        return;
      }
      t = job->targets[served].get();
    }
    CompileResult r = primary;
    if (served > 0 && !stopping_ && (is_success(primary.outcome) || primary.outcome == CompileOutcome::failed))
      r = copy_result(job->targets.front()->entry, t->entry, opts_.settings);
    std::vector<Callback> callbacks;
    {
      std::lock_guard lk(mu_);
      count_delivered(r);
      t->result = r;
      callbacks = std::move(t->callbacks);
    }
    // Recorded before anyone is told: what a waiter does next (a removal, a retry)
    // comes after the record, never before it.
    if (opts_.record) opts_.record(t->entry, job->key, r, opts_.settings);
    t->promise.set_value(r);
    for (auto& cb : callbacks) cb(r);
    ++served;
  }
}

}  // namespace neffcache
