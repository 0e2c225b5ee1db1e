// The on-disk layouts ("dialects") of the two Neuron caches; one root may hold both.
//
// The Neuron cache, shared with torch-xla and libneuronxla:
//   <root>/neuronxcc-<compiler version>/MODULE_<graph hash>+<flags hash>/
// holding the HLO input, compile_flags.json, model.neff + model.done (success),
// model.log without model.neff (failure) and <hlo file name>.lock (compiling).
//
// The cache of libtorch_neuronx_lite ("LNL": vLLM Neuron, TorchNeuron):
//   <root>/<32 hex digits: the key>/
// holding graph.hlo, command.txt (the neuronx-cc command LNL runs) and LNL's metadata
// (the inputs), graph_<key>.neff and log-neuron-cc.txt (the outputs), and
// .compilation_complete, written last, whose presence makes the folder a hit. A client
// holds the key's lock, <root>/.<key>.compilation_metadata.lock, with flock(2) while it
// compiles, inside the entry; <root>/.<key>.compilation_metadata beside it names the
// holder (lnl.hpp). A deterministic failure is our own record (own_files), which LNL
// ignores.
#pragma once

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

inline constexpr std::string_view k_hlo_module_file = "model.hlo_module.pb";  // compiler >= 2.13
inline constexpr std::string_view k_hlo_legacy_file = "model.hlo.pb";         // compiler <= 2.12
inline constexpr std::string_view k_neff_file = "model.neff";
inline constexpr std::string_view k_done_file = "model.done";
inline constexpr std::string_view k_log_file = "model.log";
inline constexpr std::string_view k_compile_flags_file = "compile_flags.json";
inline constexpr std::string_view k_lock_suffix = ".lock";
inline constexpr std::string_view k_compiler_dir_prefix = "neuronxcc-";
inline constexpr std::string_view k_module_dir_prefix = "MODULE_";
// Our own files and folders start with this, so that other tools ignore them.
inline constexpr std::string_view k_private_prefix = ".neffcache";
// A compile's output, streamed; it becomes model.log only on a deterministic failure.
inline constexpr std::string_view k_compile_log_file = ".neffcache-compile.log";
// Written before model.done: size, xxh3, command, flags, compile time, peak memory.
inline constexpr std::string_view k_meta_file = ".neffcache-meta.json";

inline constexpr std::string_view k_lnl_hlo_file = "graph.hlo";
inline constexpr std::string_view k_lnl_command_file = "command.txt";
inline constexpr std::string_view k_lnl_metadata_file = ".artifact_metadata_v0.json";
inline constexpr std::string_view k_lnl_marker_file = ".compilation_complete";
inline constexpr std::string_view k_lnl_log_file = "log-neuron-cc.txt";
// LNL's text forms of the FX graph and its example inputs, for people: not inputs of ours.
inline constexpr std::string_view k_lnl_fxgraph_file = "fxgraph.txt";
inline constexpr std::string_view k_lnl_example_inputs_file = "example_inputs.txt";
// The name of our record of a compiler's failure in an LNL entry of a bucket (and, in a
// folder, where earlier versions kept it: own_files says where it is now).
inline constexpr std::string_view k_lnl_failure_file = ".neffcache-failed.log";
// Ours: on S3, where LNL has no lock of its own, an LNL entry's lease (s3/lease.hpp) is
// this object in the entry. It is never a file of a local entry.
inline constexpr std::string_view k_lnl_lease_file = ".neffcache-lease";
inline constexpr std::size_t k_lnl_key_digits = 32;

enum class Dialect { neuron, lnl };

inline const char* to_string(Dialect d) { return d == Dialect::lnl ? "lnl" : "neuron"; }

// Whether `name` is an LNL entry folder's name: 32 lowercase hex digits (an MD5).
NEFFCACHE_DECL bool is_lnl_key(std::string_view name);

// Whether `name` is an entry folder's name: MODULE_* (a Neuron entry, in its compiler's
// folder) or an LNL key.
inline bool is_entry_folder(std::string_view name) { return name.starts_with(k_module_dir_prefix) || is_lnl_key(name); }

// The folder of a compiler's Neuron entries: neuronxcc-<version>.
NEFFCACHE_DECL std::string compiler_dir_name(std::string_view version);

// The NEFF of the LNL entry `key`: graph_<key>.neff.
NEFFCACHE_DECL std::string lnl_neff_name(std::string_view key);
// The key in the name of an LNL NEFF (graph_<key>.neff), or nothing if `name` is none.
NEFFCACHE_DECL std::optional<std::string_view> lnl_neff_key(std::string_view name);

// The file beside an LNL entry folder that names the holder of its key's lock (lnl.hpp,
// LnlHolder): ".<key>.compilation_metadata".
inline constexpr std::string_view k_lnl_holder_suffix = ".compilation_metadata";
NEFFCACHE_DECL std::string lnl_holder_name(std::string_view key);
// The key's lock, the holder file's name with k_lock_suffix: held with flock(2) and left
// behind after release.
NEFFCACHE_DECL std::string lnl_lock_name(std::string_view key);
// The key in the name of a key's lock (lnl_lock_name), or nothing if `name` is none.
NEFFCACHE_DECL std::optional<std::string_view> lnl_lock_key(std::string_view name);

// An existence-only lock (no owner record, as unmodified clients leave them) is
// presumed live until it is this old: longer than the longest real compile.
inline constexpr std::chrono::seconds k_anonymous_lock_stale_after{2 * 60 * 60};

// Where an entry lives, relative to the cache root.
struct EntryKey {
  std::string compiler_version;  // e.g. "2.21.0" or "2.15.128.0+56dc5a86"
  std::string graph_hash;
  std::string flags_hash;

  std::string compiler_dir() const { return compiler_dir_name(compiler_version); }
  std::string module_dir() const;
  std::string relative_path() const { return compiler_dir() + "/" + module_dir(); }
};

// Whether `path` names an entry by its path in a cache: neuronxcc-*/MODULE_*, exactly
// two components, or an LNL key, one. The one check for paths that come from users, S3
// listings and index records, all of which are then joined to a cache root: so besides
// the shape, a ".." anywhere is refused (no component can climb out of the cache,
// whatever a later normalization makes of it), and the prefixes leave no component empty.
NEFFCACHE_DECL bool is_entry_path(std::string_view path);

// The entry path (is_entry_path) of the folder `dir` in the cache folder `root` (both
// absolute and normalized), or nothing when `dir` is not an entry folder of that cache.
NEFFCACHE_DECL std::optional<std::string> entry_path_in(std::string_view root, std::string_view dir);

// The compiler folder (neuronxcc-<v>) of a Neuron entry at `entry_path` (a folder, or
// its path in a cache): the component before its MODULE_ folder. Empty for an LNL entry,
// whose key names its compiler itself, and for a path with no folder before the entry.
NEFFCACHE_DECL std::string compiler_dir_of(std::string_view entry_path);

// The dialect of an entry path (is_entry_path must hold).
inline Dialect dialect_of_path(std::string_view path) { return is_lnl_key(path) ? Dialect::lnl : Dialect::neuron; }

// A compiler version must be usable as one path component.
NEFFCACHE_DECL Result<void> check_compiler_version(std::string_view v);

// The files of one entry that decide its state, as a bit set. In an LNL entry the bits
// stand for its files of the same role (named in the comments).
enum class EntryFile : uint16_t {
  hlo_module = 1 << 0,   // model.hlo_module.pb; LNL: graph.hlo
  hlo_legacy = 1 << 1,   // model.hlo.pb
  flags = 1 << 2,        // compile_flags.json; LNL: command.txt
  neff = 1 << 3,         // model.neff; LNL: graph_<key>.neff
  done = 1 << 4,         // model.done; LNL: .compilation_complete
  log = 1 << 5,          // model.log; LNL: .neffcache-failed.log (ours)
  lock_module = 1 << 6,  // model.hlo_module.pb.lock; LNL on S3: .neffcache-lease (ours)
  lock_legacy = 1 << 7,  // model.hlo.pb.lock
  metadata = 1 << 8,     // LNL: .artifact_metadata_v0.json
  compiler_log = 1 << 9, // LNL: log-neuron-cc.txt
};

struct EntryFiles {
  uint16_t bits = 0;
  Dialect dialect = Dialect::neuron;
  std::string key;  // LNL: the folder's name (names the NEFF and the lock)

  // The files of the LNL entry `key`, none noted yet.
  static EntryFiles lnl(std::string_view key) { return EntryFiles{0, Dialect::lnl, std::string(key)}; }
  // Of the entry folder named `folder_name`, by its name.
  static EntryFiles of_folder(std::string_view folder_name) {
    return is_lnl_key(folder_name) ? lnl(folder_name) : EntryFiles{};
  }
  // Of the entry at `path` in a cache (is_entry_path), by its last component.
  static EntryFiles of_entry_path(std::string_view path) { return of_folder(path.substr(path.rfind('/') + 1)); }

  bool has(EntryFile f) const { return bits & static_cast<uint16_t>(f); }
  void add(EntryFile f) { bits |= static_cast<uint16_t>(f); }
  bool is_lnl() const { return dialect == Dialect::lnl; }
  bool has_hlo() const { return has(EntryFile::hlo_module) || has(EntryFile::hlo_legacy); }
  // Neuron entries have their lock inside; an LNL lock is beside the folder (lock_name).
  bool has_lock() const { return has(EntryFile::lock_module) || has(EntryFile::lock_legacy); }
  // Compiled, as its clients judge a hit: model.neff and model.done (libneuronxla looks for
  // model.done, then reads model.neff); LNL: graph.hlo, the NEFF and the marker, and
  // LNL's metadata listed (a rank's hit test).
  bool done() const {
    return has(EntryFile::neff) && has(EntryFile::done) &&
           (!is_lnl() || (has(EntryFile::hlo_module) && has(EntryFile::metadata)));
  }
  // A recorded failure: model.log without model.neff (LNL: our record, without the marker).
  bool failed() const { return is_lnl() ? has(EntryFile::log) && !has(EntryFile::done)
                                        : has(EntryFile::log) && !has(EntryFile::neff); }
  // A compile job that is ours to run: the HLO; LNL: graph.hlo and LNL's metadata, which
  // LNL writes from the traced graph once its compile succeeded and which a client needs
  // to count the entry as done (we never invent it). An LNL folder without the metadata
  // is a client's to compile (command.txt, when there, gives the flags).
  bool has_job() const { return has_hlo() && (!is_lnl() || has(EntryFile::metadata)); }
  // Whether the folder holds a product file: the NEFF or the marker (LNL: or the
  // compiler's log). A placeholder never stands beside one (fuse/entry_view.hpp).
  bool has_product() const {
    return has(EntryFile::neff) || has(EntryFile::done) || (is_lnl() && has(EntryFile::compiler_log));
  }
  // What an interrupted compile, publish or copy left: a product without the rest of a
  // done entry (a NEFF without its marker, a marker without its NEFF). Clients see a miss
  // and compile it again.
  bool partial() const { return !done() && has_product(); }
  // The input file name; the current name wins when both are present.
  std::optional<std::string_view> hlo_name() const;
  // The file names of the roles, present or not.
  std::string neff_name() const { return is_lnl() ? lnl_neff_name(key) : std::string(k_neff_file); }
  std::string_view done_name() const { return is_lnl() ? k_lnl_marker_file : k_done_file; }
  std::string_view failure_name() const { return is_lnl() ? k_lnl_failure_file : k_log_file; }
  std::string_view flags_name() const { return is_lnl() ? k_lnl_command_file : k_compile_flags_file; }
  // The lock file name relative to the entry folder, present or not: "<hlo file
  // name>.lock"; LNL: "../.<key>.compilation_metadata.lock", beside the folder.
  std::string lock_name() const;

  // The name of the entry's lock object in an S3 cache, inside the entry: its lock
  // file's name; LNL's lock is a flock beside the folder, which S3 has no use for, so
  // our lease object.
  std::string s3_lock_name() const { return is_lnl() ? std::string(k_lnl_lease_file) : lock_name(); }

  // Records `name` if it is one of the files above; other names are ignored.
  void note(std::string_view name);
};

// Our own files of an entry, and where they live: the one rule.
//
// A Neuron entry keeps ours inside it, since its layout leaves the names that start with
// .neffcache to us (and its clients' own failure record, model.log, is where they look).
// An LNL key folder is LNL's alone: save_cache() copies every file in it to the remote,
// and ranks replace the folder by a rename. So an LNL entry's are in the cache's own
// folder beside it (which a mount shows as its statistics folder: no client sees them),
// named by its key:
//
//   role          Neuron entry                     LNL entry <root>/<key>
//   record        <entry>/.neffcache-meta.json     <root>/.neffcache/lnl/<key>.meta.json
//   failure       <entry>/model.log                <root>/.neffcache/lnl/<key>.failed.log
//   compile log   <entry>/.neffcache-compile.log   <root>/.neffcache/lnl/<key>.compile.log
//   temporaries   <entry>/.neffcache-<what>-<hex>  <root>/.neffcache/lnl/<key>.<what>-<hex>
//
// Temporaries are renamed into the entry, so they are made on its file system. The record
// (cache/record.hpp) names the NEFF it describes, since a folder may be replaced under it.
// Earlier versions kept an LNL entry's files inside its folder under the Neuron names
// (k_meta_file, k_lnl_failure_file, k_compile_log_file, .neffcache-neff-*): readers still
// find those, and move_own_files_out (maintenance.hpp) moves them out.
struct OwnFiles {
  std::string dir;          // the folder that holds them: the entry, or <root>/.neffcache/lnl
  std::string record;       // the publication record
  std::string failure;      // the record of a compiler's deterministic failure
  std::string compile_log;  // the compiler's output while it runs
  std::string tmp_prefix;   // temporaries: this, then what they are, '-' and random hex

  // A new temporary path for `what` ("neff", "log", "marker", ...): not created.
  std::string temporary(std::string_view what) const;
  // Makes `dir` when it is not the entry's own folder (an LNL cache's first record).
  Result<void> make() const;
};

// The own files of the entry folder `entry_dir` (its dialect by its name).
NEFFCACHE_DECL OwnFiles own_files(std::string_view entry_dir);
// The folder of our files of the LNL entries of the cache `root` (<root>/.neffcache/lnl;
// with an empty `root`, that path relative to the cache).
NEFFCACHE_DECL std::string lnl_own_dir(std::string_view root);

// The failure record of an LNL entry relative to its folder ("../.neffcache/lnl/<key>.failed.log"),
// for a look from a descriptor of the folder; empty for a Neuron entry, whose model.log a
// listing shows.
NEFFCACHE_DECL std::string own_failure_from_entry(const EntryFiles& files);

// The failure record of the entry folder `entry_dir` where it is now: own_files' (Neuron:
// model.log), or, for an LNL entry of an earlier version that has only that one, the
// one inside its folder. (Whether there is one at all: EntryFiles::failed.)
NEFFCACHE_DECL std::string failure_record(std::string_view entry_dir);

// Whether the entry folder open as `entry_fd` (an O_PATH descriptor will do), named
// `folder_name`, is done (EntryFiles::done: its clients' hit test), from a look at each
// name that test needs rather than a listing.
NEFFCACHE_DECL bool done_at(int entry_fd, std::string_view folder_name);

// Notes in `files` (listed from the entry folder open as `entry_fd`) the files of its own
// that its listing does not show: an LNL entry's failure record, while it is no older
// than its graph.hlo. Every reader of a local entry's files calls it once it has listed
// the folder.
NEFFCACHE_DECL void note_own_files(int entry_fd, EntryFiles& files);

enum class EntryState {
  empty,       // no input and no result (a writer may still be creating it)
  pending,     // an HLO waiting to be compiled
  partial,     // a product without the rest (EntryFiles::partial): compiled again
  compiling,   // lock held by a live owner
  done,        // model.neff and model.done
  failed,      // model.log without model.neff
  stale_lock,  // lock whose owner is gone
};

NEFFCACHE_DECL const char* to_string(EntryState s);

NEFFCACHE_DECL std::optional<EntryState> parse_entry_state(std::string_view s);

// The state from the files present. A finished NEFF wins over anything else; a lock
// counts next (someone works on it, or died doing so), then a recorded failure, then a
// product without the rest (partial: a NEFF without its marker is what a killed copy or
// an interrupted publish leaves; record.hpp tells ours).
// `lock_is_live` is asked only when a lock file exists (see entry_state in lock.hpp);
// of an LNL entry, whose lock is outside the folder, whenever it is not done (a lock
// that is not held is no lock: clients leave the file behind).
NEFFCACHE_DECL EntryState classify(const EntryFiles& f, const std::function<bool()>& lock_is_live);

// One entry as the walk sees it. dir_fd is an open descriptor of the entry folder,
// valid only during the callback.
struct EntryRef {
  std::string_view compiler_dir;  // "neuronxcc-..."; LNL: empty
  std::string_view module_dir;    // "MODULE_..."; LNL: the key
  EntryFiles files;
  int dir_fd = -1;

  std::string relative_path() const;
  // The state, with locks judged by entry_state() in lock.hpp.
};

namespace detail {

// Lists a directory opened as `fd` (taking ownership), calling f(name, is_dir).
// d_type is trusted when the file system fills it, which saves a stat per name.
template <class F>
inline Result<void> list_dir(int fd, const std::string& what, F&& f) {
  DIR* d = ::fdopendir(fd);
  if (!d) {
    ::close(fd);
    return sys_error("open directory", what);
  }
  errno = 0;
  while (dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    bool is_dir = e->d_type == DT_DIR;
    if (e->d_type == DT_UNKNOWN) {
      struct stat st {};
      is_dir = ::fstatat(::dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
    }
    f(name, is_dir);
    errno = 0;
  }
  int err = errno;
  ::closedir(d);
  if (err) return sys_error("read directory", what, err);
  return {};
}

NEFFCACHE_DECL int open_dir_at(int parent, const char* name);

// Creates `dir` and its parents as needed (mode 0755 less the umask).
NEFFCACHE_DECL Result<void> make_dirs(const std::string& dir);

}  // namespace detail

// Calls `visit` for every MODULE_* folder inside every neuronxcc-* folder of `root`, and
// every LNL entry folder (a key) in `root`, one readdir per folder and no stat per file.
// Folders that vanish during the walk (another process cleaning) are skipped; an
// unreadable root is an error. Symlinks are not followed. Order is the file system's,
// not sorted.
NEFFCACHE_DECL Result<void> for_each_entry(const std::string& root,
                                           const std::function<void(const EntryRef&)>& visit);

// The files of one entry folder (not walking). A missing folder is Errc::not_found.
NEFFCACHE_DECL Result<EntryFiles> read_entry_files(const std::string& entry_dir);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/layout.ipp>
#endif
