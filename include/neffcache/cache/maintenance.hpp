// Changing entries safely while other processes use the cache: clearing failures, stale
// locks and results, removing entries. Every change that could race a compile is made
// under the entry lock, so a live compile is never disturbed: it is left alone with a
// reason (Errc::busy). Entries of either dialect (layout.hpp): files are named by their
// role (EntryFiles), and an LNL entry's lock is the client's flock beside its folder.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/cache/record.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// One entry as maintenance sees it. On a neffcachefs mount the lock is taken in the
// backing store (as every daemon and tool does) while files are removed through the
// mount, so that the kernel forgets them at once and the daemon lets go of their space.
// On a plain cache both are the same folder.
struct EntryPaths {
  std::string backing;  // the entry folder in the backing store
  std::string view;     // the same folder as clients see it

  static EntryPaths plain(const std::string& dir) { return {dir, dir}; }
};

namespace detail {

// Removes `names` from `dir`, in that order; a name already gone is fine.
NEFFCACHE_DECL Result<void> unlink_all(const std::string& dir, const std::vector<std::string>& names);

// A locked entry: its lock, and its files as they are under it.
struct LockedEntry {
  EntryLock lock;
  EntryFiles files;
};

// Takes the entry's lock (a stale one is taken over), or Errc::busy with the holder; then
// lists the entry again, since the holder before us may have changed it.
NEFFCACHE_DECL Result<LockedEntry> lock_entry(const EntryPaths& e, const LockOptions& opts);

// Removes the files of our own that an LNL entry at `entry_dir` keeps outside its folder
// (own_files): its record, failure record and compile log. A Neuron entry keeps them in
// it, and result_names names them.
NEFFCACHE_DECL void remove_own_results(const std::string& entry_dir);

// What a compile leaves in an entry of `files`' dialect, the done marker first, so that
// the entry stops being done at once and no reader sees a marker without its NEFF: the
// marker, the NEFF, the failure record, our metadata; of an LNL entry the compiler's log
// too (with a NEFF and no marker it would make the entry partial).
NEFFCACHE_DECL std::vector<std::string> result_names(const EntryFiles& files);

}  // namespace detail

namespace detail {

// Whether `name`, in an entry folder of `files`' dialect, is a temporary that a publisher
// of an earlier version left there: a NEFF or log being copied in (.neffcache-neff-*,
// .neffcache-log-*), a marker or record being written (<its name>.neffcache-tmp.<hex>).
// Nothing else: other names of ours (a lock being made, a layer's whiteout, an S3 lease,
// a download's temporary) belong to someone at work.
NEFFCACHE_DECL bool is_old_publish_temporary(std::string_view name, const EntryFiles& files);

// Whether `name` in an LNL key folder is one of ours an earlier version kept there
// (move_legacy_own_files).
NEFFCACHE_DECL bool has_legacy_own_files(std::string_view name, const EntryFiles& files);

}  // namespace detail

// An LNL entry written by an earlier version keeps our files inside its folder, under the
// Neuron entry's names (k_meta_file, k_lnl_failure_file, k_compile_log_file, and the
// temporaries of is_old_publish_temporary): its record and failure record move out to
// own_files (layout.hpp; one that a newer one replaces is removed, one that cannot move
// stays and is read where it is), its compile log and temporaries are removed. The caller
// holds the entry's lock. Nothing for a Neuron entry, whose layout leaves those names to us.
NEFFCACHE_DECL void move_legacy_own_files(const std::string& entry_dir);

// Does it for every LNL entry of the cache `root` (its key folders) that holds such files,
// each under its lock (an entry whose lock is held keeps them until its next compile,
// which moves them), until `stop` says so. A pass that found every entry clean leaves
// .neffcache/lnl/.moved-out, and later calls do nothing. Returns how many entries it cleaned.
NEFFCACHE_DECL std::size_t move_own_files_out(const std::string& root, const std::function<bool()>& stop = {},
                                              const LockOptions& opts = {});

// Forgets a recorded failure (model.log without model.neff; LNL: our failure record,
// own_files, without the marker) so that the entry compiles again. False when there was
// none.
NEFFCACHE_DECL Result<bool> clear_failure(const EntryPaths& e, const LockOptions& opts = {});

// Removes the entry's lock when its owner is gone (by taking it over and releasing it,
// the same protocol every holder follows, so a lock that turns live meanwhile is never
// removed). Returns what the lock was; Errc::busy, naming the holder, when it is live;
// Errc::not_found when there is no lock. An LNL lock is a flock: its file alone means
// nothing (clients leave it behind), so it is never stale; Errc::busy while it is held,
// else Errc::not_found, and its file stays.
NEFFCACHE_DECL Result<LockInfo> clear_stale_lock(const EntryPaths& e, const LockOptions& opts = {});

// Removes the compile's results (model.done first, so the entry stops being done at
// once, then model.neff, model.log and our metadata; LNL: its marker, NEFF and compiler
// log, our failure record and metadata), keeping the HLO and flags (LNL: graph.hlo,
// command.txt, LNL's metadata): the entry is pending again.
NEFFCACHE_DECL Result<void> clear_results(const EntryPaths& e, const LockOptions& opts = {});

// Removes a whole entry folder. Files that appear meanwhile (a writer starting anew)
// keep the folder; that is not an error.
NEFFCACHE_DECL Result<void> remove_entry(const EntryPaths& e, const LockOptions& opts = {});

enum class NeffCheck {
  ok,          // the NEFF has the size and checksum recorded when it was published
  broken,      // model.done without a NEFF, or a NEFF that differs from its record
  unrecorded,  // no record to check against (published by another tool): present, not empty
};

struct NeffVerdict {
  NeffCheck check = NeffCheck::ok;
  std::string why;  // for broken: what is wrong
};

namespace detail {

// What the LNL marker of `entry_dir` says of the NEFF's size, when it says it.
NEFFCACHE_DECL std::optional<uint64_t> lnl_marker_size(const std::string& entry_dir, const EntryFiles& files);

}  // namespace detail

// Checks the published NEFF of an entry whose files are `files` and that has its done
// marker: against the size and xxh3 our record (record.hpp) kept at publication, and
// of an LNL entry against the size its marker records (LNL writes no checksum: a NEFF
// whose size agrees with its marker and that we did not publish is ok). Our metadata
// counts only while it describes the NEFF the marker does: a client that compiled the
// entry again since left it behind. Reads the whole NEFF.
NEFFCACHE_DECL NeffVerdict verify_neff(const std::string& entry_dir, const EntryFiles& files);

// The same for the entry folder `entry_dir`, listed now.
NEFFCACHE_DECL NeffVerdict verify_neff(const std::string& entry_dir);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/maintenance.ipp>
#endif
