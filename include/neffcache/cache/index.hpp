// The content index: which entries of a cache hold a result (a NEFF, or a deterministic
// failure) of a content identity, so that an entry whose graph was compiled before under
// another name gets that result instead of a compile.
//
// A content identity is what decides a compile's result: the compiler folder, the full
// SHA-256 of the canonical graph (hlo.hpp) and the hash of the effective compiler flags
// (wrapper options removed). Two entries with equal identities differ only in what the
// compiler ignores (names, debug metadata, where the client ran).
//
// Both dialects share one index. An LNL entry has no compiler folder: its identity names
// the version of the compiler that compiles it here (pending) or that compiled it (our
// publication record's compiler_version), as neuronxcc-<version>, and its flags are its
// target as --target=<t> then its arguments (lnl_key_flags). So an LNL entry and a
// Neuron entry are twins when the compiler versions are equal, the canonical graphs are
// equal and the Neuron entry's compile_flags.json lists the same words. An LNL entry that
// its client compiled records no compiler version: it has no identity, and serves none.
//
// On disk, under the cache's root (a mount's backing folder), inside the private folder
// that a mount shows as its statistics folder, so no client of the mount sees it:
//   .neffcache/index/by-id/neuronxcc-<v>/<sha256>+<flags hash>/MODULE_<...>   a record
//   .neffcache/index/by-id/neuronxcc-<v>/<sha256>+<flags hash>/<LNL key>      a record
//   .neffcache/index/by-entry/neuronxcc-<v>/MODULE_<...>                      its identity
//   .neffcache/index/by-entry/<LNL key>                                       its identity
// One file per (identity, entry), each replaced whole by a rename, so publishers never
// contend and a reader sees a whole record or none. Every write is best effort: a full
// disk or a read-only folder costs twins, never a publish.
//
// A record is a hint, never trusted: before use, the entry it names must still hold the
// recorded result, and a NEFF must have the recorded size and checksum (the checksum is
// taken again unless the file is the very one hashed: same inode, size and mtime).
// Records that fail are dropped (and logged once, by whoever dropped them). Records not
// written by this user or root are ignored, so no other user can point an identity at
// a NEFF of their choosing.
//
// Over layers (layers.hpp), records are written in layer 0 only and name entries as the
// layers show them, each found in the layer that holds it; a lower layer's own index
// (a cache shipped with one) is read too, never changed.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/layers.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/record.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/hlo/hlo.hpp>

namespace neffcache {

inline constexpr std::string_view k_index_dir = ".neffcache/index";

// A content identity, written neuronxcc-<v>/<sha256 of the canonical graph>+<flags hash>
// (the scheduler's dedup key for an entry folder).
struct ContentId {
  std::string compiler_dir;  // neuronxcc-<version>
  std::string graph_sha256;  // 64 hex digits
  std::string flags_hash;    // 8 hex digits

  std::string str() const;
  bool operator==(const ContentId&) const = default;

  // The identity written as str(); nullopt for anything else (so a string read from a
  // file never becomes a path outside the index).
  static std::optional<ContentId> parse(std::string_view s);
};

namespace detail {

// The compiler version our publication record of `entry_dir` names (compiler_version,
// written when we compile or serve an LNL entry), when the record describes the NEFF
// there now (record_describes: a client that compiled the entry again left our record
// behind). nullopt otherwise, or when it names no version. `legacy`: as read_entry_meta's.
NEFFCACHE_DECL std::optional<std::string> recorded_compiler_version(const std::string& entry_dir, bool legacy = true);

}  // namespace detail

// The compiler folder of an LNL entry's identity (see the top): the version its result
// came from (our record), else, for an entry still to be compiled, `compiler_version`,
// the version of the compiler that compiles it here (empty: unknown). nullopt: no
// identity.
NEFFCACHE_DECL std::optional<std::string> lnl_identity_compiler_dir(const std::string& entry_dir,
                                                                    const EntryFiles& files,
                                                                    std::string_view compiler_version);

// The identity of the entry folder `entry_dir` (…/neuronxcc-<v>/MODULE_<…>, or an LNL
// entry <root>/<key>, whose compiler folder is lnl_identity_compiler_dir's with
// `compiler_version`): its HLO, read and hashed, and its flags (compile_flags.json, else
// `default_flags`; an LNL entry's command.txt). Errors: no HLO, an unreadable one, bad
// flags, an LNL entry without a known compiler version.
NEFFCACHE_DECL Result<ContentId> entry_content_id(const std::string& entry_dir,
                                                  const std::vector<std::string>& default_flags = {},
                                                  std::string_view compiler_version = {});

// What one entry holds of an identity.
struct IndexRecord {
  std::string entry;  // neuronxcc-<v>/MODULE_<…> or an LNL key, relative to the cache root
  bool failed = false;  // a recorded deterministic failure (model.log), not a NEFF
  uint64_t size = 0;    // the NEFF's bytes
  std::string xxh3;     // its checksum, 16 hex digits (a bucket's record: empty when unknown)
  std::string etag;     // a bucket's record (s3/index.hpp): the NEFF object's ETag
  double compile_seconds = 0;  // what compiling it took (what a twin saves)
  // The NEFF's inode and mtime when the checksum was taken.
  uint64_t ino = 0;
  int64_t mtime_ns = 0;

  nlohmann::ordered_json to_json() const;
  static std::optional<IndexRecord> from_json(std::string_view text);
};

// A record checked against its entry: for a NEFF, `neff` is the verified file, open, so
// that what is linked or copied is the very file checked; `dir` is the entry's folder
// (in the layer that holds it).
struct Twin {
  IndexRecord record;
  detail::UniqueFd neff;
  std::string dir;
};

namespace detail {

// The checksum (16 hex digits) of the NEFF of `entry_dir`, open as `fd`, with `st` its
// fstat: the one its publication record (read_entry_meta, record.hpp) gives when the
// record describes this very file (record_describes), else taken from `fd` (its offset is
// left alone). Errors: a read of `fd` fails.
NEFFCACHE_DECL Result<std::string> neff_xxh3(const std::string& entry_dir, int fd, const struct stat& st);

}  // namespace detail

class ContentIndex {
 public:
  // The index of the cache at `root` (a mount's backing folder, not the mount), with
  // `lowers` the read-only layers under it (layers.hpp), if any.
  explicit ContentIndex(std::string root, std::vector<std::string> lowers = {})
      : root_(root), layers_(std::move(root), std::move(lowers)) {}
  const std::string& root() const { return root_; }
  const Layers& layers() const { return layers_; }
  std::string dir() const;
  // The folder of `entry` (an entry path) in the layer that shows it.
  std::string entry_dir(std::string_view entry) const { return layers_.path(entry); }

  // Records that `entry` (neuronxcc-*/MODULE_*, or an LNL key) holds a result of `id`, as it holds it now:
  // a done NEFF (size and checksum: from the publication record when it describes this
  // very file, else hashed) or a recorded failure. `compile_seconds`: what the result
  // took to compile, when the caller knows better than the publication record.
  Result<IndexRecord> add(const ContentId& id, const std::string& entry,
                          std::optional<double> compile_seconds = std::nullopt) const;

  // The records of `id`, as written (unchecked; unreadable ones left out): layer 0's,
  // then those of the lower layers' own indexes for entries not recorded above them.
  std::vector<IndexRecord> records(const ContentId& id) const;

  // A twin of `id` other than the entry `except`: the first record whose entry still holds
  // what it records (failures only when `with_failures`). Records that fail the check are
  // dropped, each reported once through `log`.
  std::optional<Twin> find(const ContentId& id, std::string_view except, bool with_failures,
                           const std::function<void(std::string_view)>& log = {}) const;

  // Every identity with records of the graph `graph_sha256`, under any compiler folder
  // and flags hash (the same graph compiled otherwise: what `neffcache explain` compares
  // a miss with). Unreadable folders are left out; no order.
  std::vector<ContentId> ids_of_graph(std::string_view graph_sha256) const;

  // The identity recorded for `entry`, if any.
  std::optional<ContentId> id_of(const std::string& entry) const;

  // Removes the record of `entry` under `id` (and its identity, if it is that one).
  // Folders left empty go too, up to the private folder, so that a cache whose entries
  // are all removed is an empty folder again.
  void forget(const ContentId& id, const std::string& entry) const;
  // Removes whatever is recorded for `entry`.
  void forget(const std::string& entry) const {
    if (auto id = id_of(entry)) forget(*id, entry);
  }

  // Whether `entry` has an identity recorded (a stat: cheap enough for every hit).
  bool knows(const std::string& entry) const;

  // Checks a record against its entry now (see the header). Errors say why it fails.
  Result<Twin> check(const IndexRecord& r) const;

  // The entry a record of `id` named `name` stands for: an LNL key is the entry itself,
  // a MODULE_ folder is in the identity's compiler folder (a bucket's index too).
  static std::string entry_of(const ContentId& id, std::string_view name);

 private:
  // Adds the identities of `graph_sha256` in the by-id folder open as `fd` (taken) to
  // `out`, once each.
  static void ids_of_graph_in(int fd, const std::string& by_id, std::string_view graph_sha256,
                              std::vector<ContentId>& out);

  std::string id_dir(const ContentId& id) const { return id_dir(root_, id); }
  // The same in the index of the layer at `root`.
  static std::string id_dir(const std::string& root, const ContentId& id);
  std::string record_path(const ContentId& id, const std::string& entry) const;
  std::string entry_path(const std::string& entry) const;

  // A record file, if it parses and was written by us or root.
  static std::optional<IndexRecord> read_record(const std::string& path);

  // Replaces `path` whole (temporary file and rename; no fsync: a record lost in a crash
  // is a twin missed, found again by the next scan).
  static Result<void> write(const std::string& path, std::string_view text);

  std::string root_;
  Layers layers_;
};

// What a scan of a cache's entries added to its index.
struct IndexScan {
  std::size_t entries = 0;  // done and failed entries seen
  std::size_t added = 0;    // recorded now
  std::size_t unreadable = 0;  // without a readable HLO or flags: no identity
  bool complete = true;     // false when `max_added` or `stop` cut the scan short
  bool stopped = false;     // true when it was `stop` (the caller is going away)
};

// Records the done and failed entries of the cache that the index does not know yet
// (written by unmodified clients or other tools, or indexed before a crash), reading at
// most `max_added` HLOs. `stop` is asked between entries. Entries without an HLO (a
// client may delete it) cannot be indexed and are counted. LNL entries whose results
// record no compiler version (their clients compiled them) have no identity: passed over.
NEFFCACHE_DECL IndexScan index_unknown_entries(const ContentIndex& index, std::size_t max_added,
                                               const std::vector<std::string>& default_flags = {},
                                               const std::function<bool()>& stop = {});

// Forgets the whole index of the cache and records every done and failed entry anew.
NEFFCACHE_DECL IndexScan rebuild_index(const ContentIndex& index, const std::vector<std::string>& default_flags = {});

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/index.ipp>
#endif
