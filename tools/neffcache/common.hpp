// What every neffcache subcommand shares: exit codes, the one-line error format, and
// how a command finds its cache, flags and compiler version.
#pragma once

#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/file.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/maintenance.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/cache/location.hpp>

namespace neffcache::cli {

// Exit codes scripts can rely on.
inline constexpr int k_exit_ok = 0;
inline constexpr int k_exit_error = 1;  // bad input or a failed operation; stderr says which
inline constexpr int k_exit_usage = 2;  // the command line itself is wrong

inline int report(const Error& e) {
  fmt::print(stderr, "neffcache: error: {}\n", e.message);
  return k_exit_error;
}

inline int report(std::string_view message) {
  fmt::print(stderr, "neffcache: error: {}\n", message);
  return k_exit_error;
}

// The cache directory to work on: `given` (--cache), else the Neuron precedence
// (--cache_dir in NEURON_CC_FLAGS, NEURON_COMPILE_CACHE_URL, the default).
inline Result<std::string> cache_root(const std::string& given) {
  auto url = given.empty() ? resolve_cache_url() : parse_cache_url(given);
  if (!url) return url.error();
  if (url->is_s3())
    return Error{Errc::invalid_argument,
                 fmt::format("{}: this command does not work on s3:// caches yet",
                             url->text)};
  std::error_code ec;
  auto absolute = std::filesystem::absolute(url->path, ec);
  std::string path = ec ? url->path : absolute.lexically_normal().string();
  if (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
}

// An s3:// cache and a client for its bucket.
struct S3Target {
  CacheUrl url;
  std::unique_ptr<S3Client> s3;
  // An entry's name in messages and reports: its URL.
  std::string entry_url(const std::string& rel) const { return fmt::format("s3://{}/{}", url.bucket, s3_key(url.prefix, rel)); }
};

// An entry of an S3 cache named on the command line by its path in the cache,
// neuronxcc-*/MODULE_*, or by its URL (a trailing '/' is fine); anything else is an error.
inline Result<std::string> s3_entry_path(std::string arg, const CacheUrl& url) {
  while (!arg.empty() && arg.back() == '/') arg.pop_back();
  if (const std::string root = fmt::format("s3://{}/{}", url.bucket, s3_key(url.prefix, "")); arg.starts_with(root))
    arg.erase(0, root.size());
  if (!is_entry_path(arg))
    return Error{Errc::invalid_argument, fmt::format("{}: not an entry of {} (give neuronxcc-*/MODULE_*)", arg, url.text)};
  return arg;
}

// The cache `given` names (else the Neuron precedence) when it is an s3:// cache, with
// a client; nullopt for a directory cache.
inline Result<std::optional<S3Target>> s3_target(const std::string& given) {
  auto url = given.empty() ? resolve_cache_url() : parse_cache_url(given);
  if (!url) return url.error();
  if (!url->is_s3()) return std::optional<S3Target>{};
  auto s3 = S3Client::open(*url);
  if (!s3) return s3.error();
  return std::optional<S3Target>{S3Target{*url, std::move(*s3)}};
}

// Compiler flags: `given` (--flag), else the compiler flags of NEURON_CC_FLAGS; the
// cache-wrapper options are separated out either way.
inline Result<ParsedFlags> compiler_flags(const std::vector<std::string>& given) {
  std::vector<std::string> words = given;
  if (words.empty()) {
    if (auto env = process_env("NEURON_CC_FLAGS")) {
      auto split = shell_split(*env);
      if (!split) return Error{split.error().code, fmt::format("NEURON_CC_FLAGS: {}", split.error().message)};
      words = std::move(*split);
    }
  }
  return separate_wrapper_options(words);
}

// A time as ls and gc print it: UTC, to the second, ISO 8601.
inline std::string utc_time(std::chrono::system_clock::time_point t) {
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", std::chrono::floor<std::chrono::seconds>(t));
}

inline void add_cache_option(CLI::App* sub, std::string& cache) {
  sub->add_option("--cache", cache, "cache directory (default: --cache_dir in NEURON_CC_FLAGS, "
                                    "NEURON_COMPILE_CACHE_URL, /var/tmp/neuron-compile-cache)");
}

// What names a graph's entry (key, put): the HLO file, its flags, the compiler version.
struct GraphInputs {
  std::string hlo_file;
  std::vector<std::string> flags;  // empty: the compiler flags of NEURON_CC_FLAGS
  std::string compiler_version;    // empty: ask `<compiler> --version`
  std::string compiler = "neuronx-cc";
};

inline void add_graph_inputs(CLI::App* sub, GraphInputs& in) {
  sub->add_option("HLO_FILE", in.hlo_file, "serialized HloModuleProto or HloProto")->required();
  sub->add_option("--flag", in.flags,
                  "a compiler flag (repeat; write --flag=-O1 for flags that start with -); "
                  "default: the compiler flags in NEURON_CC_FLAGS")
      ->allow_extra_args(false);
  sub->add_option("--compiler-version", in.compiler_version,
                  "compiler version of the entry; default: asks '<compiler> --version'");
  sub->add_option("--compiler", in.compiler, "compiler to ask for its version")->capture_default_str();
}

// The compiler version of new entries: `given`, else what `compiler --version` says.
inline Result<std::string> compiler_version(const std::string& given, const std::string& compiler) {
  if (!given.empty()) return given;
  auto detected = detect_compiler_version(compiler);
  if (!detected)
    return Error{detected.error().code, fmt::format("cannot tell the compiler version ({}); pass --compiler-version",
                                                    detected.error().message)};
  return detected;
}

// When `root` is a neffcachefs mount, its backing directory (from the daemon's counters
// file): entries are read there, since through the mount a pending entry already lists
// the model.neff that opening it will produce.
inline std::optional<std::string> mount_backing(const std::string& root) {
  auto text = read_file(fmt::format("{}/.neffcache/stats.json", root));
  if (!text) return std::nullopt;
  auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("backing") || !j["backing"].is_string()) return std::nullopt;
  return j["backing"].get<std::string>();
}

// Where to read a cache's entries: the backing directory of a mount, else the cache.
inline std::string entries_root(const std::string& root) { return mount_backing(root).value_or(root); }

// The cache a maintenance command works on: where entries are read (the backing
// directory of a mount) and where clients see them.
struct CacheDirs {
  std::string view;     // the cache as given (a mount, or a plain directory)
  std::string backing;  // its backing directory, or the same

  static Result<CacheDirs> resolve(const std::string& given) {
    auto root = cache_root(given);
    if (!root) return root.error();
    return CacheDirs{*root, entries_root(*root)};
  }
  // An entry given by its path relative to the cache.
  EntryPaths entry(const std::string& relative) const {
    return {fmt::format("{}/{}", backing, relative), fmt::format("{}/{}", view, relative)};
  }
};

// The folder of an entry named on the command line: an entry folder or a file in one,
// as a path or relative to the cache root. Anything else is an error.
inline Result<std::string> entry_folder(const std::string& root, const std::string& arg) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path p : {fs::path(arg), fs::path(root) / arg}) {
    p = p.lexically_normal();
    if (!p.has_filename()) p = p.parent_path();  // a trailing '/'
    if (fs::is_regular_file(p, ec)) p = p.parent_path();
    if (!fs::is_directory(p, ec) || !p.filename().string().starts_with(k_module_dir_prefix)) continue;
    return fs::absolute(p, ec).lexically_normal().string();
  }
  return Error{Errc::not_found, fmt::format("{}: not a cache entry (a MODULE_* folder)", arg)};
}

// An entry named on the command line, in a cache (see entry_folder).
inline Result<EntryPaths> named_entry(const CacheDirs& dirs, const std::string& arg) {
  auto dir = entry_folder(dirs.view, arg);
  if (!dir) return dir.error();
  for (const auto& root : {dirs.view, dirs.backing})
    if (dir->starts_with(root + "/")) return dirs.entry(dir->substr(root.size() + 1));
  return Error{Errc::invalid_argument, fmt::format("{}: not an entry of the cache {}", arg, dirs.view)};
}

// A cache as the maintenance commands see it, a directory (a mount's backing directory
// for locks and reads) or an s3:// cache. Entries are named by their path in the cache
// (neuronxcc-*/MODULE_*); every change is made under the entry's lock or lease.
class MaintainedCache {
 public:
  static Result<MaintainedCache> open(const std::string& given) {
    auto s3 = s3_target(given);
    if (!s3) return s3.error();
    MaintainedCache c;
    if (*s3) {
      c.s3_ = std::move(*s3);
      return c;
    }
    auto dirs = CacheDirs::resolve(given);
    if (!dirs) return dirs.error();
    c.dirs_ = *dirs;
    return c;
  }

  bool is_s3() const { return s3_.has_value(); }
  // The cache as users name it: its folder (the mount) or its URL.
  std::string name() const { return s3_ ? s3_->url.text : dirs_->view; }
  // Where clients see an entry.
  std::string view_of(const std::string& rel) const { return s3_ ? s3_->entry_url(rel) : dirs_->entry(rel).view; }

  Result<std::vector<EntryInfo>> entries() const {
    return s3_ ? list_s3_entries(*s3_->s3, s3_->url.prefix) : list_entries(dirs_->backing);
  }

  // An entry named on the command line: a folder or file of a directory cache (see
  // named_entry), or the entry's path in an S3 cache.
  Result<std::string> named(std::string arg) const {
    if (!s3_) {
      auto e = named_entry(*dirs_, arg);
      if (!e) return e.error();
      return e->backing.substr(dirs_->backing.size() + 1);
    }
    return s3_entry_path(std::move(arg), s3_->url);
  }

  Result<bool> clear_failure(const std::string& rel) const {
    return s3_ ? clear_s3_failure(*s3_->s3, s3_->url.prefix, rel) : neffcache::clear_failure(dirs_->entry(rel));
  }
  Result<void> clear_results(const std::string& rel) const {
    return s3_ ? clear_s3_results(*s3_->s3, s3_->url.prefix, rel) : neffcache::clear_results(dirs_->entry(rel));
  }
  Result<void> remove_entry(const std::string& rel) const {
    return s3_ ? remove_s3_entry(*s3_->s3, s3_->url.prefix, rel) : neffcache::remove_entry(dirs_->entry(rel));
  }
  // Removes the entry's lock if its owner is gone; says why it was stale.
  Result<std::string> clear_stale_lock(const EntryInfo& e) const {
    if (s3_) {
      auto lease = clear_s3_stale_lock(*s3_->s3, s3_->url.prefix, e.path, e.files);
      if (!lease) return lease.error();
      if (!lease->record) return std::string("a lock object of another tool, past the default ttl");
      if (lease->record->released) return std::string("released by its holder");
      return fmt::format("{} (pid {}) did not renew it for {} s", lease->record->host, lease->record->pid,
                         lease->age.count());
    }
    auto info = neffcache::clear_stale_lock(dirs_->entry(e.path));
    if (!info) return info.error();
    return info->reason.empty() ? std::string("its owner is gone") : info->reason;
  }
  // Checks a done entry's NEFF. An S3 cache keeps no publication record: its NEFF must
  // exist and not be empty.
  NeffVerdict verify(const EntryInfo& e) const {
    if (!s3_) return verify_neff(dirs_->entry(e.path).backing);
    if (!e.files.has(EntryFile::neff)) return {NeffCheck::broken, "model.done without model.neff"};
    if (e.neff_bytes == 0) return {NeffCheck::broken, "model.neff is empty"};
    return {NeffCheck::unrecorded, ""};
  }
  // A file of an entry where it can be read: in the backing directory, or for an S3
  // cache a copy downloaded into the folder `scratch` (the caller removes it).
  Result<std::string> readable(const std::string& rel, std::string_view name, const std::string& scratch) const {
    if (!s3_) return fmt::format("{}/{}/{}", dirs_->backing, rel, name);
    std::string copy = fmt::format("{}/{}", scratch, detail::random_hex64());
    auto got = s3_->s3->download(fmt::format("{}/{}", s3_key(s3_->url.prefix, rel), name), copy);
    if (!got) return got.error();
    return copy;
  }
  // After entries were removed: compiler folders left empty go (directories only).
  void remove_empty_compiler_dirs(const std::set<std::string>& compiler_dirs) const {
    if (s3_) return;
    for (const auto& c : compiler_dirs) ::rmdir(fmt::format("{}/{}", dirs_->view, c).c_str());
  }

 private:
  std::optional<CacheDirs> dirs_;
  std::optional<S3Target> s3_;
};

}  // namespace neffcache::cli
