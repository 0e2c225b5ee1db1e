// One compile of one entry, whoever runs it (compile_entry on a folder entry, for the
// daemon, `neffcache compile` and neuron_parallel_compile; compile_s3_entry on an S3
// entry, for them and the S3 tier; neffcache-cc on either), in the same steps:
//   1. look: what the entry's files say now; a result ends the job (done, a failure
//      recorded, nothing to compile, compiles off)
//   2. take the entry's hold (compile/hold.hpp) from its Destination: at once, busy when
//      another holds it, or waiting until a deadline and looking again between tries;
//      from then on until it is given back, the hold is kept alive (KeepAlive)
//   3. look again under the hold: whoever held it before may have finished
//   4. run: the caller's step (admission by memory, the compiler)
//   5. under the hold, beaten once more first (lost: nothing goes in): the NEFF
//      published, its marker last, or the compiler's failure recorded
//   6. the hold given back, settled when the entry is done.
// Recording the result in a content index, where there is one, is the caller's
// (Produced::on_published, under the hold).
#pragma once

#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/compile/hold.hpp>
#include <neffcache/compile/outcome.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// A compiled NEFF for its destination to publish.
struct Produced {
  std::string neff;             // a whole NEFF, in the run's own work folder
  nlohmann::ordered_json meta;  // recorded with it where the destination keeps metadata
  std::string compiler_log;     // LNL's log-neuron-cc.txt, kept with the NEFF when it exists
  // Called under the hold once it is published, with where it went (Destination::publish).
  std::function<void(const std::string& where)> on_published = {};
};

// What a run hands back: its result, and for a success what to publish (`produced`), for
// a failure the log to record as the entry's (`failure_log`; empty: nothing recorded) and
// what to do under the hold once it is recorded (`on_failure_recorded`).
struct Ran {
  CompileResult result;
  Produced produced;
  std::string failure_log;
  std::function<void()> on_failure_recorded = {};
};

// Where an entry is and its result goes: a folder (FolderEntry), an S3 entry (s3/cache.hpp).
class Destination {
 public:
  virtual ~Destination() = default;
  // The entry as users name it (a folder, a URL), in messages.
  virtual std::string describe() const = 0;
  // Its files now.
  virtual Result<EntryFiles> files() const = 0;
  // Takes its hold now (Errc::busy naming the holder when another has it). `files` are
  // its files as just looked at. What a dead holder left half-published goes once the hold
  // is ours.
  virtual Result<std::unique_ptr<EntryHold>> take(const EntryFiles& files) = 0;
  // The pause between tries while waiting for the hold.
  virtual std::chrono::milliseconds poll_interval() const = 0;
  // Under the hold: publishes `p` (the NEFF, then its marker) into the entry whose files
  // are `files`; returns where it went (a path, a URL).
  virtual Result<std::string> publish(const EntryFiles& files, const Produced& p) = 0;
  // Under the hold: records the compiler's failure, the log at `log` (a whole file),
  // under the entry's failure name (and drops a NEFF it may have).
  virtual Result<void> record_failure(const EntryFiles& files, const std::string& log) = 0;
  // Makes the entry's place when it has none yet, for a compile of a graph not stored
  // yet (a folder entry's folder; an S3 entry needs none); unmake() removes it again
  // when nothing was put in it.
  virtual Result<void> make() { return {}; }
  virtual void unmake() {}
};

// An entry folder, under its lock (EntryLock::try_acquire_entry, of its dialect).
class FolderEntry final : public Destination {
 public:
  // `owner`: who the published files belong to (detail::entry_owner); none: this process.
  explicit FolderEntry(std::string entry_dir, LockOptions lock = {}, std::optional<detail::FileOwner> owner = {})
      : dir_(std::move(entry_dir)), lock_(std::move(lock)), owner_(std::move(owner)) {}
  std::string describe() const override { return dir_; }
  NEFFCACHE_DECL Result<EntryFiles> files() const override;
  NEFFCACHE_DECL Result<std::unique_ptr<EntryHold>> take(const EntryFiles& files) override;
  std::chrono::milliseconds poll_interval() const override { return lock_.poll_interval; }
  NEFFCACHE_DECL Result<std::string> publish(const EntryFiles& files, const Produced& p) override;
  NEFFCACHE_DECL Result<void> record_failure(const EntryFiles& files, const std::string& log) override;
  NEFFCACHE_DECL Result<void> make() override;
  void unmake() override { ::rmdir(dir_.c_str()); }  // (only when nothing is in it)
  // The owner its files get (set once its HLO is known).
  void set_owner(std::optional<detail::FileOwner> owner) { owner_ = std::move(owner); }

 private:
  std::string dir_;
  LockOptions lock_;
  std::optional<detail::FileOwner> owner_;
};

// How compile_held looks at an entry and waits for its hold.
struct HeldCompile {
  // What the entry's files say (`held`: looked at under the hold): a result ends the job
  // (the hold, if held, given back settled when that result is a success); nullopt: it is
  // compiled.
  std::function<std::optional<CompileResult>(const EntryFiles& files, bool held)> look;
  // While another holds the entry: wait for it until then, looking again between tries;
  // nullopt: busy at once.
  std::optional<std::chrono::steady_clock::time_point> wait_until = std::nullopt;
  // At least this long between those tries (the destination's poll_interval when longer).
  std::chrono::milliseconds min_poll{0};
};

// The run step: compiles the entry whose files (under the hold) are `files`. The hold is
// kept alive meanwhile; a run that can stop early asks hold.lost().
using RunStep = std::function<Ran(const EntryFiles& files, EntryHold& hold)>;

// Compiles the entry at `d` in the steps above. Never throws. A hold lost during the run
// makes the job transient (lost_why), whatever the run ended in, and publishes nothing.
NEFFCACHE_DECL CompileResult compile_held(Destination& d, const HeldCompile& how, const RunStep& run);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/pipeline.ipp>
#endif
