// What a cache holds: every entry with its state, size, compile time and last use, and
// the counts by state. The data behind `neffcache ls`, `scan`, `stats` and `gc`.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <neffcache/cache/layers.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/cache/record.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

struct EntryInfo {
  std::string path;  // relative to the root: neuronxcc-<version>/MODULE_<graph>+<flags>; LNL: the key
  std::size_t layer = 0;  // the layer that holds it (layers.hpp): 0 but in a layered cache
  EntryState state = EntryState::empty;
  EntryFiles files;
  uint64_t bytes = 0;       // every file of the entry folder, ours included
  uint64_t neff_bytes = 0;  // 0 without a NEFF
  // Seconds the compiler ran, when a neffcache tool or daemon compiled the entry.
  std::optional<double> compile_seconds;
  // The entry whose result this one was given (an equal graph, from the content index),
  // and that result's compile time, which this entry saved.
  std::optional<std::string> copied_from;
  double saved_seconds = 0;
  // Memory (KiB): the compile's peak (the whole process tree's), the reservation it was
  // admitted with (its predicted peak), and its runs killed for lack of memory first.
  uint64_t peak_kib = 0, predicted_peak_kib = 0;
  int oom_retries = 0;
  // When the entry was last used: for a NEFF the later of its last read (atime, which
  // relatime keeps to within a day) and its publication; otherwise the newest change of
  // any file in the folder.
  std::chrono::system_clock::time_point last_use{};
};

// Entries by state, with the Neuron tool's view of them.
struct StateCounts {
  std::size_t empty = 0, pending = 0, partial = 0, compiling = 0, done = 0, failed = 0, stale = 0;

  std::size_t& of(EntryState s);
  // Entries a compile run would take on: pending and partial ones, stale locks (taken
  // over), and failed ones when failures are retried.
  std::size_t remaining(bool with_failed) const { return pending + partial + stale + (with_failed ? failed : 0); }
  std::size_t total() const { return empty + pending + partial + compiling + done + failed + stale; }
};

namespace detail {

// Sizes, times and recorded compile time of one walked entry.
NEFFCACHE_DECL void measure_entry(const EntryRef& ref, EntryInfo& info);

// What a done entry's publication record (cache/record.hpp; a bucket's entry holds one too
// when it was served as a twin) says of its compile: its time, the twin it was copied
// from and the time that saved, its memory peak.
NEFFCACHE_DECL void note_record(EntryInfo& info, const nlohmann::json& meta);

}  // namespace detail

// Every entry the layers show (see for_each_entry: no order, vanished folders skipped),
// its lock judged as try_acquire would judge it. An unreadable root is an error.
NEFFCACHE_DECL Result<std::vector<EntryInfo>> list_entries(const Layers& layers, const LockOptions& lock = {});
// The same for the cache at `root` alone.
inline Result<std::vector<EntryInfo>> list_entries(const std::string& root, const LockOptions& lock = {}) {
  return list_entries(Layers(root), lock);
}

// Counts by state without measuring sizes: one readdir per folder, a lock read only
// where a lock file exists.
NEFFCACHE_DECL Result<StateCounts> count_entries(const Layers& layers, const LockOptions& lock = {});
inline Result<StateCounts> count_entries(const std::string& root, const LockOptions& lock = {}) {
  return count_entries(Layers(root), lock);
}

// What `gc` removes to bring a cache to at most `max_bytes`: first every entry of the
// compiler folders beyond the `keep_compilers` most recently used ones (0 keeps all),
// then done entries, least recently used first, until the rest fits. Entries that are
// not done (pending, compiling, failed) are never chosen by size. LNL entries have no
// compiler folder (their key covers a compiler version we cannot read back), so
// `keep_compilers` never drops them; by size they go as any done entry. Returns indexes
// into `entries`, in the order to remove them.
NEFFCACHE_DECL std::vector<std::size_t> plan_gc(const std::vector<EntryInfo>& entries, uint64_t max_bytes,
                                                int keep_compilers);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/inventory.ipp>
#endif
