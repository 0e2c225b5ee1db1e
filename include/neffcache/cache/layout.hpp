// The on-disk layout of the Neuron cache, shared with torch-xla and libneuronxla:
//   <root>/neuronxcc-<compiler version>/MODULE_<graph hash>+<flags hash>/
// holding the HLO input, compile_flags.json, model.neff + model.done (success),
// model.log without model.neff (failure) and <hlo file name>.lock (compiling).
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

// An existence-only lock (no owner record, as unmodified clients leave them) is
// presumed live until it is this old: longer than the longest real compile.
inline constexpr std::chrono::seconds k_anonymous_lock_stale_after{2 * 60 * 60};

// Where an entry lives, relative to the cache root.
struct EntryKey {
  std::string compiler_version;  // e.g. "2.21.0" or "2.15.128.0+56dc5a86"
  std::string graph_hash;
  std::string flags_hash;

  std::string compiler_dir() const { return fmt::format("{}{}", k_compiler_dir_prefix, compiler_version); }
  std::string module_dir() const { return fmt::format("{}{}+{}", k_module_dir_prefix, graph_hash, flags_hash); }
  std::string relative_path() const { return compiler_dir() + "/" + module_dir(); }
};

// Whether `path` names an entry by its path in a cache: neuronxcc-*/MODULE_*, exactly
// two components. The one check for paths that come from users, S3 listings and index
// records, all of which are then joined to a cache root: so besides the shape, a ".."
// anywhere is refused (no component can climb out of the cache, whatever a later
// normalization makes of it), and the prefixes leave no component empty.
inline bool is_entry_path(std::string_view path) {
  auto slash = path.find('/');
  return slash != std::string_view::npos && path.starts_with(k_compiler_dir_prefix) &&
         path.substr(slash + 1).starts_with(k_module_dir_prefix) &&
         path.find('/', slash + 1) == std::string_view::npos && path.find("..") == std::string_view::npos;
}

// A compiler version must be usable as one path component.
inline Result<void> check_compiler_version(std::string_view v) {
  bool ok = !v.empty() && v != "." && v != ".." && v.size() <= 128;
  for (char c : v) ok = ok && c != '/' && c != '\0' && static_cast<unsigned char>(c) > ' ';
  if (!ok) return Error{Errc::invalid_argument, fmt::format("bad compiler version '{}'", v)};
  return {};
}

// The files of one entry that decide its state, as a bit set.
enum class EntryFile : uint16_t {
  hlo_module = 1 << 0,   // model.hlo_module.pb
  hlo_legacy = 1 << 1,   // model.hlo.pb
  flags = 1 << 2,        // compile_flags.json
  neff = 1 << 3,         // model.neff
  done = 1 << 4,         // model.done
  log = 1 << 5,          // model.log
  lock_module = 1 << 6,  // model.hlo_module.pb.lock
  lock_legacy = 1 << 7,  // model.hlo.pb.lock
};

struct EntryFiles {
  uint16_t bits = 0;

  bool has(EntryFile f) const { return bits & static_cast<uint16_t>(f); }
  void add(EntryFile f) { bits |= static_cast<uint16_t>(f); }
  bool has_hlo() const { return has(EntryFile::hlo_module) || has(EntryFile::hlo_legacy); }
  bool has_lock() const { return has(EntryFile::lock_module) || has(EntryFile::lock_legacy); }
  // Compiled: model.neff and model.done, as the Neuron cache writes them.
  bool done() const { return has(EntryFile::neff) && has(EntryFile::done); }
  // A recorded failure: model.log without model.neff.
  bool failed() const { return has(EntryFile::log) && !has(EntryFile::neff); }
  // The input file name; the current name wins when both are present.
  std::optional<std::string_view> hlo_name() const {
    if (has(EntryFile::hlo_module)) return k_hlo_module_file;
    if (has(EntryFile::hlo_legacy)) return k_hlo_legacy_file;
    return std::nullopt;
  }
  // The lock file name, present or not: "<hlo file name>.lock".
  std::string lock_name() const {
    bool legacy = !has(EntryFile::hlo_module) &&
                  (has(EntryFile::hlo_legacy) || has(EntryFile::lock_legacy));
    return fmt::format("{}{}", legacy ? k_hlo_legacy_file : k_hlo_module_file, k_lock_suffix);
  }

  // Records `name` if it is one of the files above; other names are ignored.
  void note(std::string_view name) {
    using F = EntryFile;
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
  compiling,   // lock held by a live owner
  done,        // model.neff and model.done
  failed,      // model.log without model.neff
  stale_lock,  // lock whose owner is gone
};

inline const char* to_string(EntryState s) {
  switch (s) {
    case EntryState::empty: return "empty";
    case EntryState::pending: return "pending";
    case EntryState::compiling: return "compiling";
    case EntryState::done: return "done";
    case EntryState::failed: return "failed";
    case EntryState::stale_lock: return "stale";
  }
  return "?";
}

inline std::optional<EntryState> parse_entry_state(std::string_view s) {
  for (auto st : {EntryState::empty, EntryState::pending, EntryState::compiling, EntryState::done,
                  EntryState::failed, EntryState::stale_lock})
    if (s == to_string(st)) return st;
  return std::nullopt;
}

// The state from the files present. A finished NEFF wins over anything else; a lock
// counts next (someone works on it, or died doing so), then a recorded failure.
// A NEFF without model.done is an interrupted publish and so still pending.
// `lock_is_live` is asked only when a lock file exists (see entry_state in lock.hpp).
inline EntryState classify(const EntryFiles& f, const std::function<bool()>& lock_is_live) {
  if (f.done()) return EntryState::done;
  if (f.has_lock()) return lock_is_live() ? EntryState::compiling : EntryState::stale_lock;
  if (f.failed()) return EntryState::failed;
  if (f.has_hlo()) return EntryState::pending;
  return EntryState::empty;
}

// One entry as the walk sees it. dir_fd is an open descriptor of the entry folder,
// valid only during the callback.
struct EntryRef {
  std::string_view compiler_dir;  // "neuronxcc-..."
  std::string_view module_dir;    // "MODULE_..."
  EntryFiles files;
  int dir_fd = -1;

  std::string relative_path() const { return fmt::format("{}/{}", compiler_dir, module_dir); }
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

// Calls `visit` for every MODULE_* folder inside every neuronxcc-* folder of `root`,
// one readdir per folder and no stat per file. Folders that vanish during the walk
// (another process cleaning) are skipped; an unreadable root is an error. Symlinks
// are not followed. Order is the file system's, not sorted.
inline Result<void> for_each_entry(const std::string& root,
                                   const std::function<void(const EntryRef&)>& visit) {
  int root_fd = detail::open_dir_at(AT_FDCWD, root.c_str());
  if (root_fd < 0) return sys_error("open cache root", root);
  Result<void> inner_error;
  auto r = detail::list_dir(root_fd, root, [&](std::string_view cdir, bool is_dir) {
    if (!is_dir || !inner_error || cdir.substr(0, k_compiler_dir_prefix.size()) != k_compiler_dir_prefix) return;
    std::string cname(cdir);
    int cfd = detail::open_dir_at(root_fd, cname.c_str());
    if (cfd < 0) return;  // vanished or not a folder: nothing to walk
    std::string cpath = root + "/" + cname;
    auto rc = detail::list_dir(cfd, cpath, [&](std::string_view mdir, bool mis_dir) {
      if (!mis_dir || mdir.substr(0, k_module_dir_prefix.size()) != k_module_dir_prefix) return;
      std::string mname(mdir);
      detail::UniqueFd mfd(detail::open_dir_at(cfd, mname.c_str()));
      if (!mfd) return;
      EntryRef ref{cname, mname, {}, mfd.get()};
      int list_fd = ::dup(mfd.get());
      if (list_fd < 0) return;
      auto rm = detail::list_dir(list_fd, cpath + "/" + mname,
                                 [&](std::string_view file, bool) { ref.files.note(file); });
      if (rm) visit(ref);
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
  EntryFiles files;
  auto r = detail::list_dir(fd, entry_dir, [&](std::string_view name, bool) { files.note(name); });
  if (!r) return r.error();
  return files;
}

}  // namespace neffcache
