// An entry's work folder and publication: hashed copies, removal of a work folder
// without following links, the owner an entry's files get, and the atomic publication
// of a NEFF (our record, then model.neff, then model.done; LNL's names in an LNL entry,
// with our own files outside it: own_files, layout.hpp), with the cleanup of what a dead
// publisher left and the end of a publish interrupted after its NEFF was in place.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <nlohmann/json_fwd.hpp>

#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/cache/record.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::string entry_name(const std::string& entry_dir);

// The modes a publish creates an entry's files with (the process's umask applies): a
// NEFF is never writable by others; the marker, our record and logs are 0644.
inline constexpr mode_t k_neff_mode = 0666 & ~S_IWOTH;
inline constexpr mode_t k_marker_mode = 0644;

// Copies what `in` reads from its start to `out` (at its offset) and returns the xxh3 of
// the bytes copied. `in` is read with pread (fd_xxh3), so its offset is left alone and a
// descriptor shared with others (a Twin's checked NEFF) can be copied. Errors name
// `from` (a read) or `to` (a write). Both descriptors stay the caller's; nothing is
// fsynced or removed: what a failure leaves in `out` is the caller's to remove.
NEFFCACHE_DECL Result<uint64_t> copy_hashed(int in, const std::string& from, int out, const std::string& to);

// Copies what `in` reads (from its start; `from` names it in errors) to `to`, whole or not
// at all: into a temporary file beside `to` (mode 0644), renamed over it. With `xxh3` (16
// hex digits, as xxh3_hex writes them): only bytes with that checksum, else Errc::io (the
// file changed while it was copied). Durable::yes: synced before the rename, so that a
// crash never leaves `to` holding a part. `in` stays the caller's; on failure `to` is as
// it was.
enum class Durable { no, yes };
NEFFCACHE_DECL Result<void> copy_into_place(int in, const std::string& from, const std::string& to,
                                            std::string_view xxh3 = {}, Durable durable = Durable::no);

// Copies `from` to `to` (created exclusively), fsyncs it and returns the xxh3 of the
// bytes copied; on failure `to` is removed.
NEFFCACHE_DECL Result<uint64_t> copy_file_hashed(const std::string& from, const std::string& to, mode_t mode,
                                                 const std::optional<FileOwner>& owner = {});

// Removes a folder and everything in it without following a link at any depth: each
// step is taken from a descriptor of a folder already opened, so a link that someone
// swaps in meanwhile (a compiler run as another user owns its work folder) is removed,
// never followed. Folders deeper than `depth` stay.
NEFFCACHE_DECL void remove_tree_at(int parent, const std::string& name, int depth = 64);

// A folder of ours (a work, staging or scratch folder) removed with remove_tree_at when
// this goes, or at reset(); none while `dir` is empty. Not copied.
struct RemovedTree {
  std::string dir;
  RemovedTree() = default;
  explicit RemovedTree(std::string d) : dir(std::move(d)) {}
  RemovedTree(const RemovedTree&) = delete;
  RemovedTree& operator=(const RemovedTree&) = delete;
  ~RemovedTree() { reset(); }
  void reset() {
    if (!dir.empty()) remove_tree_at(AT_FDCWD, std::exchange(dir, {}));
  }
};

// The owner that files written into an entry get: when we run as root, the owner of
// the entry's HLO, so that a root daemon leaves each user's entries to that user.
NEFFCACHE_DECL std::optional<FileOwner> entry_owner(const std::string& hlo_path);

NEFFCACHE_DECL void fsync_dir(const std::string& dir);
// Puts `tmp`, a whole NEFF already on the entry's file system (neff_tmp_name), in place
// as its NEFF (`names`: model.neff, or LNL's graph_<key>.neff): first our record (`meta`
// plus `xxh3` and what ties it to this file: size, mtime, inode; record.hpp), synced,
// then the rename (which keeps inode and mtime), then the done marker, last (model.done,
// empty; or LNL's .compilation_complete, with the time and the NEFF's size). Readers see
// no NEFF, or a whole one, and never the marker without it; a crash after the rename
// leaves a NEFF that our record describes, which finish_publish completes. On failure
// `tmp` is gone and no NEFF stands. Returns the published path.
NEFFCACHE_DECL Result<std::string> commit_neff(const std::string& entry_dir, const std::string& tmp,
                                               const std::string& xxh3, nlohmann::ordered_json meta,
                                               const std::optional<FileOwner>& owner, const EntryFiles& names = {});

// A new temporary name for a NEFF being published into `entry_dir`, where own_files puts
// temporaries (that folder made if missing).
NEFFCACHE_DECL std::string neff_tmp_name(const std::string& entry_dir);

// Writes the done marker of the entry `entry_dir` (model.done, empty; LNL's marker with
// the time and `neff_bytes`) whole, through a temporary of our own (no name of ours ever
// shows in an LNL key folder).
NEFFCACHE_DECL Result<void> write_marker(const std::string& entry_dir, const EntryFiles& names, uint64_t neff_bytes,
                                         const std::optional<FileOwner>& owner);

// Publishes `neff` into the entry: copied to a temp file there, fsynced, then
// commit_neff (`names` as there). The files get the process's umask, never write access
// for others, and `owner`. An LNL entry also gets `compiler_log` as log-neuron-cc.txt,
// before the NEFF, when the compiler wrote one. Returns the published path.
NEFFCACHE_DECL Result<std::string> publish(const std::string& entry_dir, const std::string& neff,
                                           nlohmann::ordered_json meta, const std::optional<FileOwner>& owner = {},
                                           const EntryFiles& names = {}, const std::string& compiler_log = {});

}  // namespace detail
// Removes the half-written copies of a NEFF, a log, a record or a marker that a publisher
// left (own_files, and an earlier version's: is_old_publish_temporary) when it died
// mid-copy. Only the entry's lock holder writes them, so the caller must hold the lock;
// other private files (a lock being created) stay. Of an LNL entry, what an earlier
// version kept in its folder moves out too (move_legacy_own_files).
NEFFCACHE_DECL void remove_publish_leftovers(const std::string& entry_dir);

// Whether the entry `entry_dir` (files `files`) holds a publish of ours interrupted after
// its NEFF was renamed into place: a NEFF and no marker, and our record describing that
// file (record_describes: its size and mtime). A stat and the record, no hashing:
// finish_publish checks the bytes.
NEFFCACHE_DECL bool publish_interrupted(const std::string& entry_dir, const EntryFiles& files);

// Finishes a publish that publish_interrupted found: when the NEFF's bytes have the
// recorded checksum, writes the marker. The caller holds the entry's lock. True when it
// wrote it; false when there was nothing of ours to finish (a NEFF that is not the one
// recorded: a leftover, which stays for its clients to compile again).
NEFFCACHE_DECL Result<bool> finish_publish(const std::string& entry_dir, const EntryFiles& files,
                                           const std::optional<detail::FileOwner>& owner);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/publish.ipp>
#endif
