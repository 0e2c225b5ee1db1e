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
// holder (lnl.hpp). A deterministic failure is our own record, .neffcache-failed.log,
// which LNL ignores.
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

#include <fmt/format.h>

#include <neffcache/core/detail/fs.hpp>
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
inline constexpr std::string_view k_lnl_failure_file = ".neffcache-failed.log";
// Ours: on S3, where LNL has no lock of its own, an LNL entry's lease (s3/lease.hpp) is
// this object in the entry. It is never a file of a local entry.
inline constexpr std::string_view k_lnl_lease_file = ".neffcache-lease";
inline constexpr std::size_t k_lnl_key_digits = 32;

enum class Dialect { neuron, lnl };

inline const char* to_string(Dialect d) { return d == Dialect::lnl ? "lnl" : "neuron"; }

// Whether `name` is an LNL entry folder's name: 32 lowercase hex digits (an MD5).
inline bool is_lnl_key(std::string_view name) {
  if (name.size() != k_lnl_key_digits) return false;
  for (char c : name)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

// Whether `name` is an entry folder's name: MODULE_* (a Neuron entry, in its compiler's
// folder) or an LNL key.
inline bool is_entry_folder(std::string_view name) { return name.starts_with(k_module_dir_prefix) || is_lnl_key(name); }

// The folder of a compiler's Neuron entries: neuronxcc-<version>.
inline std::string compiler_dir_name(std::string_view version) { return fmt::format("{}{}", k_compiler_dir_prefix, version); }

// The NEFF of the LNL entry `key`: graph_<key>.neff.
inline std::string lnl_neff_name(std::string_view key) { return fmt::format("graph_{}.neff", key); }
// The key in the name of an LNL NEFF (graph_<key>.neff), or nothing if `name` is none.
inline std::optional<std::string_view> lnl_neff_key(std::string_view name) {
  constexpr std::string_view prefix = "graph_", suffix = ".neff";
  if (name.size() <= prefix.size() + suffix.size() || !name.starts_with(prefix) || !name.ends_with(suffix))
    return std::nullopt;
  const auto key = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  if (!is_lnl_key(key)) return std::nullopt;
  return key;
}

// The key's lock in an LNL root, beside the entry folder: ".<key>.compilation_metadata.lock",
// held with flock(2) and left behind after release.
inline std::string lnl_lock_name(std::string_view key) { return fmt::format(".{}.compilation_metadata.lock", key); }
// The file beside it that names the lock's holder (lnl.hpp, LnlHolder).
inline std::string lnl_holder_name(std::string_view key) { return fmt::format(".{}.compilation_metadata", key); }

// An existence-only lock (no owner record, as unmodified clients leave them) is
// presumed live until it is this old: longer than the longest real compile.
inline constexpr std::chrono::seconds k_anonymous_lock_stale_after{2 * 60 * 60};

// Where an entry lives, relative to the cache root.
struct EntryKey {
  std::string compiler_version;  // e.g. "2.21.0" or "2.15.128.0+56dc5a86"
  std::string graph_hash;
  std::string flags_hash;

  std::string compiler_dir() const { return compiler_dir_name(compiler_version); }
  std::string module_dir() const { return fmt::format("{}{}+{}", k_module_dir_prefix, graph_hash, flags_hash); }
  std::string relative_path() const { return compiler_dir() + "/" + module_dir(); }
};

// Whether `path` names an entry by its path in a cache: neuronxcc-*/MODULE_*, exactly
// two components, or an LNL key, one. The one check for paths that come from users, S3
// listings and index records, all of which are then joined to a cache root: so besides
// the shape, a ".." anywhere is refused (no component can climb out of the cache,
// whatever a later normalization makes of it), and the prefixes leave no component empty.
inline bool is_entry_path(std::string_view path) {
  if (is_lnl_key(path)) return true;
  auto slash = path.find('/');
  return slash != std::string_view::npos && path.starts_with(k_compiler_dir_prefix) &&
         path.substr(slash + 1).starts_with(k_module_dir_prefix) &&
         path.find('/', slash + 1) == std::string_view::npos && path.find("..") == std::string_view::npos;
}

// The entry path (is_entry_path) of the folder `dir` in the cache folder `root` (both
// absolute and normalized), or nothing when `dir` is not an entry folder of that cache.
inline std::optional<std::string> entry_path_in(std::string_view root, std::string_view dir) {
  if (dir.size() <= root.size() + 1 || !dir.starts_with(root) || dir[root.size()] != '/') return std::nullopt;
  std::string_view rel = dir.substr(root.size() + 1);
  if (!is_entry_path(rel)) return std::nullopt;
  return std::string(rel);
}

// The compiler folder (neuronxcc-<v>) of a Neuron entry at `entry_path` (a folder, or
// its path in a cache): the component before its MODULE_ folder. Empty for an LNL entry,
// whose key names its compiler itself, and for a path with no folder before the entry.
inline std::string compiler_dir_of(std::string_view entry_path) {
  while (entry_path.size() > 1 && entry_path.back() == '/') entry_path.remove_suffix(1);
  auto last = entry_path.rfind('/');
  if (last == std::string_view::npos || is_lnl_key(entry_path.substr(last + 1))) return {};
  auto dir = entry_path.substr(0, last);
  return std::string(dir.substr(dir.rfind('/') + 1));
}

// The dialect of an entry path (is_entry_path must hold).
inline Dialect dialect_of_path(std::string_view path) { return is_lnl_key(path) ? Dialect::lnl : Dialect::neuron; }

// A compiler version must be usable as one path component.
inline Result<void> check_compiler_version(std::string_view v) {
  bool ok = !v.empty() && v != "." && v != ".." && v.size() <= 128;
  for (char c : v) ok = ok && c != '/' && c != '\0' && static_cast<unsigned char>(c) > ' ';
  if (!ok) return Error{Errc::invalid_argument, fmt::format("bad compiler version '{}'", v)};
  return {};
}

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
  // Compiled: model.neff and model.done, as the Neuron cache writes them (LNL: the NEFF
  // and the marker).
  bool done() const { return has(EntryFile::neff) && has(EntryFile::done); }
  // A recorded failure: model.log without model.neff (LNL: our record, without the marker).
  bool failed() const { return is_lnl() ? has(EntryFile::log) && !has(EntryFile::done)
                                        : has(EntryFile::log) && !has(EntryFile::neff); }
  // A compile job that is ours to run: the HLO; LNL: graph.hlo and LNL's metadata, which
  // LNL writes from the traced graph once its compile succeeded and which a client needs
  // to count the entry as done (we never invent it). An LNL folder without the metadata
  // is a client's to compile (command.txt, when there, gives the flags).
  bool has_job() const { return has_hlo() && (!is_lnl() || has(EntryFile::metadata)); }
  // LNL: what an interrupted compile left, outputs without the marker.
  bool partial() const {
    return is_lnl() && !has(EntryFile::done) && (has(EntryFile::neff) || has(EntryFile::compiler_log));
  }
  // The input file name; the current name wins when both are present.
  std::optional<std::string_view> hlo_name() const {
    if (is_lnl()) return has(EntryFile::hlo_module) ? std::optional(k_lnl_hlo_file) : std::nullopt;
    if (has(EntryFile::hlo_module)) return k_hlo_module_file;
    if (has(EntryFile::hlo_legacy)) return k_hlo_legacy_file;
    return std::nullopt;
  }
  // The file names of the roles, present or not.
  std::string neff_name() const { return is_lnl() ? lnl_neff_name(key) : std::string(k_neff_file); }
  std::string_view done_name() const { return is_lnl() ? k_lnl_marker_file : k_done_file; }
  std::string_view failure_name() const { return is_lnl() ? k_lnl_failure_file : k_log_file; }
  std::string_view flags_name() const { return is_lnl() ? k_lnl_command_file : k_compile_flags_file; }
  // The lock file name relative to the entry folder, present or not: "<hlo file
  // name>.lock"; LNL: "../.<key>.compilation_metadata.lock", beside the folder.
  std::string lock_name() const {
    if (is_lnl()) return "../" + lnl_lock_name(key);
    bool legacy = !has(EntryFile::hlo_module) &&
                  (has(EntryFile::hlo_legacy) || has(EntryFile::lock_legacy));
    return fmt::format("{}{}", legacy ? k_hlo_legacy_file : k_hlo_module_file, k_lock_suffix);
  }

  // The name of the entry's lock object in an S3 cache, inside the entry: its lock
  // file's name; LNL's lock is a flock beside the folder, which S3 has no use for, so
  // our lease object.
  std::string s3_lock_name() const { return is_lnl() ? std::string(k_lnl_lease_file) : lock_name(); }

  // Records `name` if it is one of the files above; other names are ignored.
  void note(std::string_view name) {
    using F = EntryFile;
    if (is_lnl()) {
      if (name == k_lnl_hlo_file) add(F::hlo_module);
      else if (name == k_lnl_command_file) add(F::flags);
      else if (name == k_lnl_metadata_file) add(F::metadata);
      else if (name == k_lnl_marker_file) add(F::done);
      else if (name == k_lnl_log_file) add(F::compiler_log);
      else if (name == k_lnl_failure_file) add(F::log);
      else if (name == k_lnl_lease_file) add(F::lock_module);
      else if (name.starts_with("graph_") && name == lnl_neff_name(key)) add(F::neff);
      return;
    }
    if (name.substr(0, 6) != "model." && name != k_compile_flags_file) return;
    if (name == k_hlo_module_file) add(F::hlo_module);
    else if (name == k_hlo_legacy_file) add(F::hlo_legacy);
    else if (name == k_compile_flags_file) add(F::flags);
    else if (name == k_neff_file) add(F::neff);
    else if (name == k_done_file) add(F::done);
    else if (name == k_log_file) add(F::log);
    else if (name == "model.hlo_module.pb.lock") add(F::lock_module);
    else if (name == "model.hlo.pb.lock") add(F::lock_legacy);
  }
};

enum class EntryState {
  empty,       // no input and no result (a writer may still be creating it)
  pending,     // an HLO waiting to be compiled
  partial,     // LNL: outputs of an interrupted compile, no marker: compiled again
  compiling,   // lock held by a live owner
  done,        // model.neff and model.done
  failed,      // model.log without model.neff
  stale_lock,  // lock whose owner is gone
};

inline const char* to_string(EntryState s) {
  switch (s) {
    case EntryState::empty: return "empty";
    case EntryState::pending: return "pending";
    case EntryState::partial: return "partial";
    case EntryState::compiling: return "compiling";
    case EntryState::done: return "done";
    case EntryState::failed: return "failed";
    case EntryState::stale_lock: return "stale";
  }
  return "?";
}

inline std::optional<EntryState> parse_entry_state(std::string_view s) {
  for (auto st : {EntryState::empty, EntryState::pending, EntryState::partial, EntryState::compiling, EntryState::done,
                  EntryState::failed, EntryState::stale_lock})
    if (s == to_string(st)) return st;
  return std::nullopt;
}

// The state from the files present. A finished NEFF wins over anything else; a lock
// counts next (someone works on it, or died doing so), then a recorded failure.
// A NEFF without model.done is an interrupted publish and so still pending.
// `lock_is_live` is asked only when a lock file exists (see entry_state in lock.hpp);
// of an LNL entry, whose lock is outside the folder, whenever it is not done (a lock
// that is not held is no lock: clients leave the file behind).
inline EntryState classify(const EntryFiles& f, const std::function<bool()>& lock_is_live) {
  if (f.done()) return EntryState::done;
  if (f.is_lnl()) {
    if (lock_is_live()) return EntryState::compiling;
    if (f.failed()) return EntryState::failed;
    if (f.partial()) return EntryState::partial;
    return f.has_job() ? EntryState::pending : EntryState::empty;
  }
  if (f.has_lock()) return lock_is_live() ? EntryState::compiling : EntryState::stale_lock;
  if (f.failed()) return EntryState::failed;
  if (f.has_hlo()) return EntryState::pending;
  return EntryState::empty;
}

// One entry as the walk sees it. dir_fd is an open descriptor of the entry folder,
// valid only during the callback.
struct EntryRef {
  std::string_view compiler_dir;  // "neuronxcc-..."; LNL: empty
  std::string_view module_dir;    // "MODULE_..."; LNL: the key
  EntryFiles files;
  int dir_fd = -1;

  std::string relative_path() const {
    return compiler_dir.empty() ? std::string(module_dir) : fmt::format("{}/{}", compiler_dir, module_dir);
  }
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

inline int open_dir_at(int parent, const char* name) {
  return retry_eintr([&] {
    return ::openat(parent, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
  });
}

}  // namespace detail

// Calls `visit` for every MODULE_* folder inside every neuronxcc-* folder of `root`, and
// every LNL entry folder (a key) in `root`, one readdir per folder and no stat per file.
// Folders that vanish during the walk (another process cleaning) are skipped; an
// unreadable root is an error. Symlinks are not followed. Order is the file system's,
// not sorted.
inline Result<void> for_each_entry(const std::string& root,
                                   const std::function<void(const EntryRef&)>& visit) {
  int root_fd = detail::open_dir_at(AT_FDCWD, root.c_str());
  if (root_fd < 0) return sys_error("open cache root", root);
  // Lists the entry folder `name` in the folder `parent_fd` and visits it.
  auto visit_entry = [&](int parent_fd, const std::string& parent, std::string_view compiler_dir,
                         const std::string& name) {
    detail::UniqueFd mfd(detail::open_dir_at(parent_fd, name.c_str()));
    if (!mfd) return;
    EntryRef ref{compiler_dir, name, EntryFiles::of_folder(compiler_dir.empty() ? name : ""), mfd.get()};
    int list_fd = ::dup(mfd.get());
    if (list_fd < 0) return;
    auto rm = detail::list_dir(list_fd, parent + "/" + name, [&](std::string_view file, bool) { ref.files.note(file); });
    if (rm) visit(ref);
  };
  Result<void> inner_error;
  auto r = detail::list_dir(root_fd, root, [&](std::string_view cdir, bool is_dir) {
    if (!is_dir || !inner_error) return;
    if (is_lnl_key(cdir)) return visit_entry(root_fd, root, {}, std::string(cdir));
    if (!cdir.starts_with(k_compiler_dir_prefix)) return;
    std::string cname(cdir);
    int cfd = detail::open_dir_at(root_fd, cname.c_str());
    if (cfd < 0) return;  // vanished or not a folder: nothing to walk
    std::string cpath = root + "/" + cname;
    auto rc = detail::list_dir(cfd, cpath, [&](std::string_view mdir, bool mis_dir) {
      if (mis_dir && mdir.starts_with(k_module_dir_prefix)) visit_entry(cfd, cpath, cname, std::string(mdir));
    });
    if (!rc && rc.error().code != Errc::not_found) inner_error = rc.error();
  });
  if (!r) return r;
  return inner_error;
}

// The files of one entry folder (not walking). A missing folder is Errc::not_found.
inline Result<EntryFiles> read_entry_files(const std::string& entry_dir) {
  int fd = detail::open_dir_at(AT_FDCWD, entry_dir.c_str());
  if (fd < 0) return sys_error("open entry", entry_dir);
  std::string_view dir = entry_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  EntryFiles files = EntryFiles::of_folder(dir.substr(dir.rfind('/') + 1));
  auto r = detail::list_dir(fd, entry_dir, [&](std::string_view name, bool) { files.note(name); });
  if (!r) return r.error();
  return files;
}

}  // namespace neffcache
