// A local disk tier over an S3 cache: the folder a daemon mounts when its cache is in a
// bucket (neffcachefs s3://... --local-cache DIR). The folder has the layout of the
// S3 cache and is filled from S3 as names are asked for:
//
// - A name missing here is looked up on S3 (fill): a compiler folder is made as a
//   folder; an entry as its folder with its HLO and compile_flags.json (an LNL entry, a
//   key in the root: graph.hlo, command.txt, LNL's metadata and its text files). A NEFF
//   is not fetched then: here the entry is pending, so the mount shows a placeholder
//   NEFF (and LNL's marker), and opening it runs settle().
// - settle() is the scheduler's compile function. Inputs written here and missing on S3
//   are uploaded (compile_flags.json, then the HLO, created only if absent). An entry
//   done on S3 has its NEFF fetched here. Else it is compiled under the entry's S3 lease
//   (compile_s3_entry), and its NEFF moves here from the staging folder once S3 has the
//   NEFF and model.done. The scheduler gives concurrent opens of one entry one job, so
//   one fetch. Recorded failures stay on S3 only: `neffcache retry s3://...` clears
//   them for every host.
// - NEFFs here are kept under a size cap, the least recently opened leaving first. An
//   entry leaves only when S3 has it done, and not within a minute of its last use; it
//   loses its model.done and model.neff here, so it is pending again and the next open
//   fetches it again.
// - Compiles take `compile_slots` at a time; fetches, uploads and waits for another
//   host's lease take none, so a done entry is served while compiles run.
// - A folder renamed to an LNL key in the root is LNL's save_cache() publishing an entry
//   to a shared disk (promote): it goes to S3 first, under the entry's lease, and only
//   if S3 has no such entry.
//
// With Options::read_only the bucket is a read-only layer under the local folder
// (neffcachefs --lower s3://...): it is only read (listed, fetched from), never written,
// not even a lease. What it lacks, or has pending, is compiled here, into the local
// entry, and stays here: those NEFFs are never evicted (only entries the bucket has done
// are), and nothing is uploaded.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <neffcache/core/decl.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/index.hpp>
#include <neffcache/s3/lease.hpp>
#include <neffcache/s3/tier_parts.hpp>

namespace neffcache {

class S3Tier {
 public:
  struct Options {
    std::string prefix;                // the cache's key prefix in the bucket
    std::string root;                  // the local folder (absolute)
    uint64_t cap_bytes = 50ull << 30;  // NEFF bytes kept here
    int compile_slots = 1;
    // The bucket is a read-only layer (see the top): nothing is written to it.
    bool read_only = false;
    // Compiles happen elsewhere (a compile farm, `neffcache compile --watch`): an entry the
    // bucket lacks done is never compiled here; settle() puts its inputs up and is busy
    // until the bucket has it done (looking at most every k_farm_recheck), then fetches it.
    bool wait_for_farm = false;
    // An entry used this recently stays, whatever the cap: a reader may be about to
    // open the NEFF it was just fetched for.
    std::chrono::seconds keep_after_use{60};
    S3CompileOptions compile = {};
  };

  // Names asked for again within this time are answered from the last look at S3.
  static constexpr std::chrono::seconds k_recheck = detail::RecentLooks::k_recheck;
  // How often an entry waited for from a compile farm is looked at on S3 (the scheduler
  // asks every second): one listing per entry every 5 s.
  static constexpr std::chrono::seconds k_farm_recheck{5};

  S3Tier(std::unique_ptr<S3Client> s3, Options o);
  S3Tier(const S3Tier&) = delete;
  S3Tier& operator=(const S3Tier&) = delete;

  S3Client& s3() { return *s3_; }
  // Compile work folders and downloads in flight: inside the tier (so a finished file
  // is renamed into place) but out of the mount's view (the mount shows its own
  // .neffcache folder at the root).
  std::string staging() const;

  // Makes `name` in the local folder `dir` from S3 if S3 has it: a compiler folder in
  // the root, an entry in a compiler folder, an entry's inputs in an entry folder that
  // has no HLO yet. True if something was made.
  bool fill(const std::string& dir, std::string_view name);

  // Before a listing of the local folder `dir`: the compiler folders and LNL entries of
  // the root, or the entries of a compiler folder (as empty folders, filled when looked
  // into), or the inputs of an entry that has none here.
  void fill_listing(const std::string& dir);

  // The products a listing of the local entry folder `dir` shows that are in the bucket
  // and not here yet (the NEFF and the marker of an entry done on S3, fetched when
  // opened); none for anything else. One listing of the entry on S3.
  std::vector<std::string> names_elsewhere(const std::string& dir);

  // Whether another host holds the local entry `entry_dir` (a Neuron entry): the bucket has
  // a live lease named `lock_name` (its HLO's lock file's name) there, which this process
  // does not hold for a client. (Our own compile's is never asked about: it holds the
  // entry's local lock file all along, which a lookup finds first. Nor is a lease judged
  // ours by its record's host and pid: two containers may share both.) Asked of S3 at every call, no
  // recent look reused, and within a bound (S3Client::quick): a client polls the lock
  // file that stands for it. False when S3 cannot be asked. When false, the entry's next
  // look at S3 is made afresh: the lease may have just ended in a publish.
  bool held_elsewhere(const std::string& entry_dir, std::string_view lock_name);

  // A client of this host creates the lock file `lock_name` in the local entry `entry_dir`
  // (it is about to compile the entry itself), or, for an LNL key, takes the key's flock
  // (`lock_name`: the lease's name; the folder may not exist yet): the entry's lease is
  // taken for it first, within a bound, so that other hosts wait for its NEFF. It is given
  // back when the client lets go (upload_written).
  ClientHold hold_for_client(const std::string& entry_dir, std::string_view lock_name);
  // What hold_for_client took for a client of the local entry `entry_dir` is given back
  // (its client did not get its lock after all, or let go of the entry before making it).
  void give_back(const std::string& entry_dir) {
    if (auto lease = end_stand_in(entry_dir)) (void)lease->release();
  }

  // After a question of theirs found S3 silent or out of reach, clients' questions
  // (held_elsewhere, hold_for_client) are answered without S3 for up to this long: a rank
  // waits out the bound once, not at each look and create. One question in each
  // k_unanswered_probe still goes to S3, and its answer ends the pause.
  static constexpr std::chrono::seconds k_unanswered_pause{30};
  static constexpr std::chrono::seconds k_unanswered_probe{5};

  // What a client wrote into the local entry `entry_dir` goes to S3 (nothing to a
  // read-only bucket): its inputs if S3 has no HLO for it, then, once the entry is done
  // here (the client compiled it itself, and wrote model.done after the NEFF), its NEFF
  // unless S3 has the entry done. Inputs that a client writes under the entry's lock
  // wait: that client compiles the graph itself, and they go up with its NEFF, or
  // with our stand-in's lease (settle), so that no other host takes them for a graph
  // nobody compiles. Another host holding the entry's lease is no error: it publishes
  // the entry.
  // A lease held for a client whose lock is gone with the entry not done here (it gave
  // up, or died) is given back once its inputs are up.
  Result<void> upload_written(const std::string& entry_dir);

  // Brings the local entry `entry_dir` to its state on S3, compiling it there first if
  // it needs it (see the top of this file). Outcomes as compile_s3_entry's.
  CompileResult settle(const std::string& entry_dir, const CompileSettings& s);

  // A client renames the local folder `folder` (no entry) to the LNL entry `key` in the
  // root: LNL's save_cache() publishing an entry to a shared disk. The entry goes to S3
  // first, under its lease: every regular file of the folder but ours, graph.hlo after
  // the rest and the marker last, created only if absent. Errors: Errc::exists when S3
  // has the entry (its HLO or its marker) or another host holds its lease (publishing
  // or compiling it), so that a rename onto a taken name fails and overwrites nothing,
  // whichever host came first; others when S3 cannot be reached, and then what was
  // uploaded is removed again.
  // A read-only bucket takes nothing: the rename stays a local one.
  Result<void> promote(const std::string& folder, const std::string& key);

  // A warm start (`neffcache warm`, before a daemon mounts this folder) in two steps.
  // warm() brings the entry `rel`, done on S3, toward this folder before anyone asks for
  // it: the files a lookup and an open would fetch (its inputs missing here, its NEFF, LNL's
  // log and marker) are downloaded into a folder of the staging area, not yet synced.
  // Returns the NEFF bytes fetched, 0 when it was here already. Errors: Errc::not_found
  // when S3 has it not done (nothing to fetch), others when S3 or this folder fail.
  Result<uint64_t> warm(const std::string& rel);
  // warmed() then makes every entry warm() staged durable with one syncfs (not an fsync per
  // file: on this VM's disk those took most of a warm start of large NEFFs), moves their
  // files into place, inputs first and the marker last, keeps them under the cap as a fetch
  // is, and syncs once more. A crash before the first syncfs's end leaves no entry changed;
  // after it, only files already durable are moved. Returns the entries placed; an entry
  // that could not be is left as it was, with a warning. Errors: the sync failed.
  Result<std::size_t> warmed();

  // A reader opened the local entry's NEFF: it stays longest.
  void opened(const std::string& entry_dir) { kept_.opened(entry_dir); }

  nlohmann::ordered_json stats() const;
  bool read_only() const { return o_.read_only; }

 private:
  static CompileResult transient(std::string why) {
    return CompileResult::of(CompileOutcome::transient, std::move(why));
  }

  // `path` relative to the tier's root ("" for the root); none outside it.
  std::optional<std::string> relative(const std::string& path) const;

  // 0 for the root, 1 for a compiler folder, 2 for an entry.
  static int depth_of(std::string_view rel) {
    return rel.empty() ? 0 : 1 + static_cast<int>(std::count(rel.begin(), rel.end(), '/'));
  }

  static bool make_dir(const std::string& path);

  // The NEFF a client compiled into the local entry `entry_dir` (done here) goes to S3,
  // under the entry's lease (`lease`: our stand-in's, else taken now), its inputs first,
  // as one of our compiles would, unless S3 has the entry done.
  CompileResult publish_here(const std::string& entry_dir, const std::string& rel, std::optional<S3Lease> lease);

  // A client of this host compiles the local entry `entry_dir` itself (`why`: its lock
  // here is held). We hold the entry's S3 lease for it, renewed on a thread of its own
  // (StandIns) whatever the scheduler's workers are doing, so that other hosts wait for
  // its NEFF instead of compiling the graph too, and put its inputs up once the lease is
  // ours (a host that sees them then waits). Busy:
  // the scheduler looks again until the client lets go of its lock. A lease held
  // elsewhere, or an S3 we cannot reach, leaves the client alone: it compiles anyway.
  CompileResult stand_in(const std::string& entry_dir, const std::string& rel, const EntryFiles& remote,
                         const EntryFiles& here, std::string why);

  // The name of the lease object of an entry whose files are `remote` on S3 and `here`
  // locally: its HLO's (model.hlo_module.pb, or the legacy name) as every host names it,
  // from here while S3 has no HLO yet.
  static std::string lease_name(const EntryFiles& remote, const EntryFiles& here) {
    return remote.has_hlo() || !here.has_hlo() ? remote.s3_lock_name() : here.s3_lock_name();
  }

  // The lease held for a client of `entry_dir`, if any, no longer held for it.
  std::optional<S3Lease> end_stand_in(const std::string& entry_dir) {
    auto held = stand_ins_.take(entry_dir);
    if (!held) return std::nullopt;
    return held->end();
  }

  static bool local_done(const std::string& entry_dir) {
    auto files = read_entry_files(entry_dir);
    return files && files->done();
  }

  // Makes the entry `rel` here with its inputs from S3, unless it has an HLO here
  // already. True if the entry now has its HLO here.
  bool fill_entry(const std::string& rel);

  // The entry's inputs from S3 into the folder `dir`, unless S3 was asked within
  // k_recheck. True if the entry has its HLO here.
  bool fetch_inputs(const std::string& rel, const std::string& dir);

  // Uploads the local entry's flags and HLO when S3 has no HLO (`remote`). True if
  // this call created the HLO on S3.
  Result<bool> upload_missing_inputs(const std::string& entry_dir, const std::string& rel, const EntryFiles& remote);

  // Uploads the NKI kernels that the HLO file `hlo_path` calls and the bucket lacks
  // (s3/nki.hpp). Kernels this host lacks are left: the graph compiles only where they are,
  // and that compile names them. Errors: an upload failed.
  Result<void> upload_kernels(const std::string& hlo_path);

  // Whether the names of a bucket's entry hold our record (k_meta_file).
  static bool has_record(const std::vector<std::string>& names) {
    return std::find(names.begin(), names.end(), k_meta_file) != names.end();
  }
  // Fetches the NEFF of an entry done on S3 (`remote`: its files there) into the local
  // entry: downloaded into the staging folder, out of the mount's view, and renamed into
  // place (LNL: with its compiler's log), then the done marker (LNL's, as S3 has it).
  // `twin_record`: the bucket's entry has our record, which may name a twin (link_twin).
  CompileResult fetch(const std::string& entry_dir, const std::string& base, const EntryFiles& remote,
                      bool twin_record = false);

  // An entry done in the bucket as a twin served there (serve_s3_twin: its record names the
  // entry it was copied from and that NEFF's checksum), whose original this host holds,
  // done, with that very checksum: the original's NEFF is published into the local entry
  // as a folder's twin is (compile/twin.hpp: a hard link where it can be), not fetched.
  // True if so; false leaves the entry as it was.
  bool link_twin(const std::string& entry_dir, const std::string& base);

  // The bucket's record of a failed compile of the entry (`remote`: its files there) into
  // the local entry, as its own failure record, when the entry here is neither done nor
  // failed: it then shows what a folder shared with the host that failed would (model.log,
  // no NEFF). A record that cannot be fetched leaves the entry as it was.
  // (`via`: the client to ask, quick_ for a client's question.)
  void take_failure(S3Client& via, const std::string& entry_dir, const std::string& base, const EntryFiles& remote);
  // Whether the entry's failure record here was written while a lease is held for its
  // client here (not an older record, nor a copy of the bucket's): only that one goes up.
  bool failed_under_hold(const std::string& entry_dir) const;

  // The compile's NEFF, now on S3, moves into the local entry from the staging entry
  // (LNL: with its compiler's log), then its done marker.
  void take_staged(const std::string& entry_dir, const std::string& staged);

  // The regular files of `folder` that a promotion publishes, in the order it writes
  // them: all but ours (.neffcache*), sorted, then graph.hlo, then the marker.
  static Result<std::vector<std::string>> publishable_files(const std::string& folder);

  // Counts a NEFF now here, then makes room for it.
  void keep(const std::string& entry_dir, uint64_t bytes);

  // Removes a done entry's results here once S3 is known to have them.
  void evict(const std::string& entry_dir);

  // With Options::wait_for_farm: true when `entry_dir` was looked at on S3 within
  // k_farm_recheck (then no request is made now); else notes a look now.
  bool farm_looked_recently(const std::string& entry_dir);

  // (The parts are destroyed before the clients: the leases held for clients are given
  // back through them.)
  std::unique_ptr<S3Client> s3_;
  std::unique_ptr<S3Client> quick_;  // s3_'s bucket, each request bounded: for waiting clients' questions
  Options o_;
  detail::RecentLooks looks_;
  detail::KeptNeffs kept_;
  detail::StandIns stand_ins_;  // leases held for clients that compile an entry (stand_in)
  detail::CompileSlots slots_;
  std::mutex farm_mu_;  // guards farm_looks_; a leaf, held for no request
  std::map<std::string, std::chrono::steady_clock::time_point> farm_looks_;
  // Whether this client's question goes unasked (k_unanswered_pause); note_unanswered
  // starts the pause when `e` says S3 did not answer (no answer of S3 itself), and
  // note_answered ends it.
  bool unanswered();
  void note_unanswered(const Error& e);
  void note_answered() { unanswered_until_ = 0; }
  std::atomic<std::chrono::steady_clock::rep> unanswered_until_{0}, unanswered_probe_{0};

  struct Staged {  // an entry warm() staged for warmed()
    std::string dir, staged;
    std::vector<std::string> names;  // the order they go into place: the marker last
    uint64_t neff_bytes = 0;
  };
  std::mutex warm_mu_;  // guards warming_; a leaf
  std::vector<Staged> warming_;
  struct {
    std::atomic<uint64_t> fetches{0}, fetched_bytes{0}, uploads{0}, lookups{0}, evictions{0}, published{0};
  } counters_;
};

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/tier.ipp>
#include <neffcache/s3/tier_steps.ipp>
#endif
