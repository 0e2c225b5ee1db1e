// An entry's publication record: what we put into an entry when we published its NEFF
// (compile/publish.hpp writes it), read by the content index, `neffcache ls` and
// `verify`, and by whoever must tell our own interrupted publish from a leftover NEFF.
// It is a JSON object in the file own_files names (layout.hpp; for an LNL entry written
// by an earlier version, the one inside its folder):
//   size, xxh3          the NEFF's bytes and checksum (16 hex digits)
//   mtime_ns, ino       the NEFF's mtime and inode: the file it was written for (written
//                       before the NEFF is renamed into place, which keeps both)
//   compiler, flags, compile_seconds, peak_rss_kib, predicted_peak_kib, oom_retries,
//   attempts, host      the compile
//   copied_from, copy, compile_seconds_saved   a twin's (compile/twin.hpp)
//   compiler_version    of an LNL entry, which has no compiler folder
// A record describes only the file it was written for, by its size and mtime: LNL ranks
// replace a key folder by a rename and compile an entry again in place, leaving our record
// behind, and either gives the NEFF another mtime. A faithful copy of a cache (cp -a,
// rsync -a, a restore) keeps both, and its NEFFs are still those the records describe.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include <neffcache/cache/layout.hpp>
#include <neffcache/core/decl.hpp>

namespace neffcache::detail {

inline int64_t mtime_ns(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

// The record of the entry folder `entry_dir` as a JSON object: an empty one when it is
// missing or is no JSON object. `st`, when given, gets the record file's status (zeroed
// when there is none).
// `legacy`: also where an earlier version kept an LNL entry's record, inside its folder,
// which a client of a mount can write too (false where a client must not speak for us).
NEFFCACHE_DECL nlohmann::json read_entry_meta(const std::string& entry_dir, struct stat* st = nullptr,
                                              bool legacy = true);

// Whether `meta` (read_entry_meta, `meta_st` its file's status) describes the NEFF whose
// status is `neff`: the recorded size and mtime. A record of an earlier version names no
// mtime: then a NEFF of the recorded size that is no newer than the record.
NEFFCACHE_DECL bool record_describes(const nlohmann::json& meta, const struct stat& meta_st, const struct stat& neff);

// The fields that tie a record to the NEFF `neff` (its status) it is written for.
NEFFCACHE_DECL void describe_neff(nlohmann::ordered_json& meta, const struct stat& neff);

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/record.ipp>
#endif
