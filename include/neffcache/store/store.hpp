// A compile cache as the tools and the daemon work on it, whatever holds it: a local
// directory (perhaps a neffcachefs mount, read in its backing folder), an S3 bucket, or
// the local tier of an S3 cache (the folder a daemon mounts). One interface, so that no
// caller asks "is this S3?" and decodes entry names again:
//
// - an entry is a typed value, Entry: its store and its path in the cache,
//   neuronxcc-<version>/MODULE_<graph>+<flags>, or an LNL entry's key (a directory may
//   hold both dialects, see layout.hpp); only a store makes one (from its listing or from
//   a name it accepted), so the path always has one of those shapes;
// - the name users see for an entry is view(entry): a folder, or a URL. Compile batches
//   name their jobs so too, and the store's compile function takes those names back;
// - maintenance changes an entry under its lock (a directory) or its lease (S3), and a
//   live compile is left alone with Errc::busy, as cache/maintenance.hpp and s3/cache.hpp do;
// - where a store cannot do something it says so in a one-line Error.
//
// Stores are not copied or moved: entries point at theirs, which must outlive them.
#pragma once

#include <algorithm>
#include <compare>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <neffcache/core/decl.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/compile/pipeline.hpp>
#include <neffcache/compile/peaks.hpp>
#include <neffcache/compile/twin.hpp>
#include <neffcache/cache/index.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/store/remote.hpp>

namespace neffcache::store {

class Store;

// An entry of a store. Cheap to copy; valid while its store lives.
class Entry {
 public:
  const Store& store() const { return *store_; }
  // The entry's path in the cache: neuronxcc-<version>/MODULE_<graph>+<flags>; LNL: its key.
  const std::string& path() const { return path_; }
  Dialect dialect() const { return dialect_of_path(path_); }
  // Its compiler folder: neuronxcc-<version>; empty for an LNL entry, which has none (its
  // folder is in the cache's root).
  std::string compiler_dir() const {
    if (dialect() == Dialect::lnl) return {};
    // Not path_.find('/'): inlined at -O3, GCC 12 warns falsely that its memchr reads out of
    // bounds (-Wstringop-overread).
    return {path_.begin(), std::find(path_.begin(), path_.end(), '/')};
  }
  // Where users see it (Store::view).
  std::string view() const;

  bool operator==(const Entry& o) const { return store_ == o.store_ && path_ == o.path_; }
  // By path: the order of listings and reports.
  std::strong_ordering operator<=>(const Entry& o) const { return path_ <=> o.path_; }

 private:
  friend class Store;
  Entry(const Store* store, std::string path) : store_(store), path_(std::move(path)) {}
  const Store* store_;
  std::string path_;
};

// A file of an entry as a path this process can read: the file itself, or a copy
// downloaded for the reader, removed when this object goes. Move-only.
class LocalFile {
 public:
  enum class Kind { in_place, temporary_copy };
  LocalFile(std::string path, Kind kind) : path_(std::move(path)), kind_(kind) {}
  LocalFile(LocalFile&& o) noexcept : path_(std::move(o.path_)), kind_(std::exchange(o.kind_, Kind::in_place)) {}
  LocalFile& operator=(LocalFile&&) = delete;
  LocalFile(const LocalFile&) = delete;
  ~LocalFile();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  Kind kind_;
};

// What listing does when the cache's folder does not exist.
enum class IfMissing {
  error,  // Errc::not_found: a cache named by mistake is reported
  empty,  // no entries: a cache nothing was written to yet
};

// The scheduler's compile function for jobs named by Store::view (Scheduler::Options::compile).
using CompileFunction = std::function<CompileResult(const std::string& job, const CompileSettings&)>;
// Whether a job is settled already (see Scheduler::Options::settled); empty: the compile
// function finds out itself.
using SettledFunction = std::function<std::optional<CompileOutcome>(const std::string& job, const CompileSettings&)>;

// The scheduler's content-index functions for jobs named by Store::view
// (Scheduler::Options reuse and record); empty: the store keeps no index.
using ReuseFunction = std::function<std::optional<CompileResult>(const std::string& job, const std::string& key,
                                                                 const CompileSettings&)>;
using RecordFunction =
    std::function<void(const std::string& job, const std::string& key, const CompileResult&, const CompileSettings&)>;

// What Store::update_index did.
struct IndexUpdate {
  std::size_t entries = 0;     // done and failed entries seen
  std::size_t added = 0;       // recorded now
  std::size_t unreadable = 0;  // without a readable HLO or flags: no identity
  std::size_t forgotten = 0;   // records of entries that hold no result any more
};

class Store {
 public:
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  // The cache as users name it: its folder as given (absolute), or its URL.
  virtual std::string name() const = 0;

  // Every entry with its state, sizes, compile time and last use; no order.
  virtual Result<std::vector<EntryInfo>> list(IfMissing if_missing = IfMissing::error) const = 0;

  // The entry a row of list() is.
  Entry entry(const EntryInfo& info) const { return Entry(this, info.path); }

  // The entry at a path in the cache (neuronxcc-*/MODULE_*, or an LNL key); anything else
  // is Errc::invalid_argument. The entry need not exist (yet).
  Result<Entry> at(std::string_view path) const;

  // An entry named on the command line. A directory cache takes an entry folder or a file
  // in one, as a path or relative to the cache; an S3 cache the entry's path in the
  // cache or its URL. Anything else is an error naming the argument.
  virtual Result<Entry> named(std::string_view arg) const = 0;

  // The entry a file of it names, as "Extracting graphs (PATH)" lines do: PATH is the
  // entry's HLO, another file in it, or the entry itself.
  virtual Result<Entry> named_by_file(std::string_view path) const { return named(path); }

  // Where users see an entry: its folder (through the mount for a mount) or its URL.
  // Compile batches name their jobs so (see compile_function).
  virtual std::string view(const Entry& e) const = 0;

  // An entry's files now.
  virtual Result<EntryFiles> files(const Entry& e) const = 0;

  // A file of an entry where this process can read it (see LocalFile).
  virtual Result<LocalFile> local_file(const Entry& e, std::string_view name) const = 0;

  // Stores a graph as graph extraction does: compile_flags.json, then the HLO, created
  // only if absent. False when the entry had its HLO already (nothing written).
  virtual Result<bool> put_graph(const Entry& e, std::string_view hlo_bytes,
                                 const std::vector<std::string>& flags) const = 0;

  // Maintenance, each under the entry's lock or lease (Errc::busy while it compiles).
  // Forgets a recorded failure; false when there was none.
  virtual Result<bool> clear_failure(const Entry& e) const = 0;
  // Removes the results (NEFF, model.done, failure log): the entry is pending again.
  virtual Result<void> clear_results(const Entry& e) const = 0;
  // Removes the whole entry.
  virtual Result<void> remove(const Entry& e) const = 0;
  // Removes the entry's lock when its owner is gone; says why it was stale. Errc::busy
  // naming the holder when it is live; Errc::not_found when it went meanwhile.
  virtual Result<std::string> clear_stale_lock(const EntryInfo& e) const = 0;
  // Checks a done entry's NEFF (against its publication record where there is one).
  virtual NeffVerdict verify(const EntryInfo& e) const = 0;
  // After entries were removed: their compiler folders, where empty now, go too (a
  // store without folders has nothing to do). An empty name (an LNL entry's) is none.
  virtual void remove_empty_compiler_dirs(const std::set<std::string>& compiler_dirs) const = 0;

  // Compiling. The scheduler's compile function for jobs named by view(); empty: the
  // scheduler's own (compile_entry on the folder).
  virtual CompileFunction compile_function() const = 0;
  // The scheduler's "already settled?" check for jobs named by view(): by default the
  // entry folder's files (a directory, the local tier).
  virtual SettledFunction settled_function() const { return folder_settled; }
  // The content index (cache/index.hpp) where this store keeps one; nullptr: none.
  virtual const ContentIndex* content_index() const { return nullptr; }
  // Records in the content index the done and failed entries it does not know yet
  // (written by clients, other tools or hosts), `default_flags` those of an entry
  // without compile_flags.json; with `rebuild`, forgets the whole index first. An error
  // for a store that keeps no index.
  virtual Result<IndexUpdate> update_index(bool rebuild, const std::vector<std::string>& default_flags) const;
  // A twin of `id` in the content index (cache/index.hpp, s3/index.hpp) other than the
  // entry `except`, checked as before it is served (failures only when
  // `with_failures`); `default_flags` those of an entry without compile_flags.json.
  // nullopt where the store keeps no index.
  virtual std::optional<IndexRecord> find_twin(const ContentId& id, std::string_view except, bool with_failures,
                                               const std::vector<std::string>& default_flags) const {
    (void)id, (void)except, (void)with_failures, (void)default_flags;
    return std::nullopt;
  }
  // Records in the content index that `e` holds a result of `id` now (a NEFF that took
  // `compile_seconds`), for a compile published outside the scheduler (the compiler shim).
  // An error for a store that keeps no index.
  virtual Result<void> record_result(const Entry& e, const ContentId& id, double compile_seconds) const;
  // The scheduler's functions that reuse and record results through it.
  virtual ReuseFunction reuse_function() const { return {}; }
  virtual RecordFunction record_function() const { return {}; }
  // Where the peak memory of this cache's compiles is kept (compile/peaks.hpp), for the
  // scheduler to predict from; empty: in this process only.
  virtual std::string peaks_dir() const { return {}; }
  // True when a daemon serves this cache and compiles an entry when its NEFF is opened
  // (a neffcachefs mount): a tool asks it rather than compiling here.
  virtual bool compiles_on_open() const { return false; }
  // True when an entry's result may be copied to entries of an equal graph (the
  // scheduler's dedup); false where each entry publishes its own NEFF (S3).
  virtual bool copies_equal_graphs() const { return true; }
  // Where a compile of the entry takes its hold and publishes (compile/pipeline.hpp): its
  // folder under its lock (a directory's: in its backing folder), the S3 entry under its
  // lease. Errc::invalid_argument for a store that compiles only through its scheduler
  // (the local tier: compile_function).
  virtual Result<std::unique_ptr<Destination>> destination(const Entry& e) const;
  // Copies the file `name` of an entry to `to`, whole or not at all (into a temporary
  // file beside `to`, renamed).
  virtual Result<void> copy_file(const Entry& e, std::string_view name, const std::string& to) const;
  // The folder whose files are this cache's entries, which clients read and write as on
  // a disk (a directory as given, a mount's mount point, the local tier's folder);
  // nullopt for a cache that has none (a bucket).
  virtual std::optional<std::string> folder() const { return std::nullopt; }
  // Where a tool keeps what it remembers of this cache (the compiler shim's compiler
  // versions, counters and peaks): the cache's private folder (a mount's, in its backing
  // folder), or for a cache without one (a bucket) the user's ~/.cache/neffcache.
  virtual std::string state_dir() const;
  // The counters of the daemon serving this cache (its stats.json), when there is one.
  virtual std::optional<std::string> daemon_stats() const { return std::nullopt; }
  // Why nothing in this cache can change (a read-only folder, a read-only cache mounted
  // without an upper layer), in one line; nullopt when entries may change. Over layers,
  // those of the read-only layers refuse each change by themselves.
  virtual std::optional<Error> unchangeable() const { return std::nullopt; }

  // The entry whose local folder is `dir`; Errc::invalid_argument when `dir` is none (a
  // store without local folders has none).
  virtual Result<Entry> of_folder(const std::string& dir) const;
  // What the local folder a daemon mounts has elsewhere (store/remote.hpp): a plain
  // directory's remote does nothing.
  virtual const Remote& remote() const { return no_remote_; }

 protected:
  Store() = default;
  // An entry of this store; `path` must be an entry path (is_entry_path, checked by callers).
  Entry make_entry(std::string path) const { return Entry(this, std::move(path)); }

 private:
  Remote no_remote_;
};

inline std::string Entry::view() const { return store_->view(*this); }

}  // namespace neffcache::store

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/store/store.ipp>
#endif
