// Results reused across entries of an equal graph ("twins"): an entry whose content
// identity (cache/index.hpp) already has a result gets it instead of a compile, under
// its own lock, and every result published is recorded in the content index.
//
// A NEFF comes into the entry as a hard link of the twin's file where the file system
// allows it (one inode: no copy, no extra disk), else a reflink, else a copy whose
// checksum is compared with the record's as it is made. Either way the file is the one
// the index just checked (linked through its open descriptor), then published as a
// compile publishes (publish.hpp: model.neff, metadata with `copied_from`, model.done).
// A recorded failure comes as a copy of the twin's model.log.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/index.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/compile/publish.hpp>
#include <neffcache/core/decl.hpp>

namespace neffcache {

// The cache root of an entry folder (…/<root>/neuronxcc-<v>/MODULE_<…>, or an LNL
// entry …/<root>/<key>) and the entry's path in it.
NEFFCACHE_DECL std::string root_of_entry(const std::string& entry_dir);
NEFFCACHE_DECL std::string entry_in_cache(const std::string& entry_dir);

namespace detail {

// Puts the verified NEFF `twin.neff` into an entry folder as `tmp` and returns
// how: "link", "reflink" or "copy". A link only when the file has the owner the entry's
// files get (a root daemon gives each user's entry files of that user).
NEFFCACHE_DECL Result<std::string> place_twin_neff(const Twin& twin, const std::string& tmp,
                                                   const std::optional<FileOwner>& owner);

// Publishes the verified NEFF `twin.neff` as the NEFF of `entry_dir` (`files`: its files),
// as a twin: placed (place_twin_neff) and committed with the record of where it came
// from (commit_neff), and for an LNL entry `compiler_version`, which its identity names.
NEFFCACHE_DECL Result<std::string> publish_twin_neff(const Twin& twin, const std::string& entry_dir,
                                                     const EntryFiles& files, const std::optional<FileOwner>& owner,
                                                     const std::optional<std::string>& compiler_version);

// Copies the twin's failure record (model.log; LNL: ours) as the failure record of
// `entry_dir` (own_files, by the entry's dialect).
NEFFCACHE_DECL Result<void> place_twin_failure(const std::string& source_dir, const std::string& entry_dir,
                                               const std::optional<FileOwner>& owner);

}  // namespace detail

// Gives `entry_dir` the result of `twin` (checked by ContentIndex::check, or just
// published by this process), under the entry's own lock. Outcomes: success (published,
// `twin` and `saved_seconds` set), failed (the twin's failure recorded), already_done or
// failed_cached (settled meanwhile), busy (its lock is held), transient (an I/O error:
// nothing changed).
NEFFCACHE_DECL CompileResult serve_twin(const Twin& twin, const std::string& entry_dir, const CompileSettings& s);

// The compiler folder that made the result `entry_dir` holds now (`files`: its files): a
// Neuron entry's folder, or the version our record of an LNL entry's result names;
// nullopt when nobody can tell (an LNL entry its client compiled).
inline std::optional<std::string> result_compiler_dir(const std::string& entry_dir, const EntryFiles& files) {
  if (!files.is_lnl()) return compiler_dir_of(entry_dir);
  return lnl_identity_compiler_dir(entry_dir, files, {});
}

// The compiler folder of the identity of `entry_dir` when compiled with `s`: a Neuron
// entry's folder, or the version of the compiler an LNL entry is compiled with here.
NEFFCACHE_DECL std::optional<std::string> identity_compiler_dir(const std::string& entry_dir,
                                                                const CompileSettings& s);

// Gives `entry_dir` the result of `source_dir`, an entry of the same cache with the same
// content identity that this process just compiled (the scheduler's in-process dedup).
// Its NEFF's checksum is the publication record's when that describes the file, as for
// the content index (neff_xxh3).
NEFFCACHE_DECL CompileResult copy_result(const std::string& source_dir, const std::string& entry_dir,
                                         const CompileSettings& s);

// The directory cache's content index, as the scheduler is given it (Scheduler::Options
// reuse and record). `key` is the job's dedup key, a ContentId (prepare_job); any other
// key (an entry without a readable graph) has no twins.
//
// Before a compile: a checked twin's result, served into `entry_dir`; nullopt when there
// is none (or the index is off: s.content_index). `lowers`: the read-only layers under
// the entry's cache (layers.hpp), whose entries serve twins too.
NEFFCACHE_DECL std::optional<CompileResult> folder_reuse(const std::string& entry_dir, const std::string& key,
                                                         const CompileSettings& s,
                                                         const std::vector<std::string>& lowers = {});

// After a result was delivered to `entry_dir`: records it (success or recorded failure).
NEFFCACHE_DECL void folder_record(const std::string& entry_dir, const std::string& key, const CompileResult& r,
                                  const CompileSettings& s, const std::vector<std::string>& lowers = {});

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/twin.ipp>
#endif
