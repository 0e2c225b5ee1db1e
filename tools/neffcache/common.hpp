// What every neffcache subcommand shares: exit codes, the one-line error format, how a
// subcommand is registered, and how a command finds its cache (a store::Store), flags
// and compiler version.
#pragma once

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/store/open.hpp>
#include <neffcache/cache/location.hpp>
#include <neffcache/cache/url.hpp>
#include <neffcache/cache/index.hpp>

#include "common/log.hpp"

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

// What a command does with its cache: reads it, or changes entries (which a read-only
// cache refuses at once, in one line).
enum class Access { read, change };

// The cache a command works on: `given` (--cache: a folder, a neffcachefs mount or an
// s3:// URL), else the Neuron precedence (--cache_dir in NEURON_CC_FLAGS,
// NEURON_COMPILE_CACHE_URL, the default).
inline Result<std::unique_ptr<store::Store>> open_cache(const std::string& given, Access access = Access::read) {
  auto cache = store::open_store(given);
  if (cache && access == Access::change)
    if (auto why = (*cache)->unchangeable()) return *why;
  return cache;
}

// A cache and its entries, as most maintenance commands begin.
struct ListedCache {
  std::unique_ptr<store::Store> store;
  std::vector<EntryInfo> entries;
};

// To change entries, only those of layer 0 are listed: over layers (a neffcachefs mount
// with --upper or --lower) the read-only layers' entries are left as they are, and a line
// on stderr says how many.
inline Result<ListedCache> open_listed(const std::string& given, Access access = Access::read) {
  auto cache = open_cache(given, access);
  if (!cache) return cache.error();
  auto entries = (*cache)->list();
  if (!entries) return entries.error();
  if (access == Access::change)
    if (auto lower = std::erase_if(*entries, [](const EntryInfo& e) { return e.layer != 0; }); lower > 0)
      fmt::print(stderr, "neffcache: {} entr{} of read-only layers left as {} (remove one through the mount to hide it)\n",
                 lower, lower == 1 ? "y" : "ies", lower == 1 ? "it is" : "they are");
  return ListedCache{std::move(*cache), std::move(*entries)};
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

// Before a batch of compiles: records in the content index the done and failed entries
// it does not know yet (written by clients or other tools), reading at most
// k_index_catch_up HLOs, so that their twins are found. Nothing for a store without an
// index, or a mount (whose daemon does it).
inline constexpr std::size_t k_index_catch_up = 10000;
inline void catch_up_index(const store::Store& cache, const std::vector<std::string>& default_flags) {
  const ContentIndex* index = cache.content_index();
  if (!index || cache.compiles_on_open()) return;
  auto scan = index_unknown_entries(*index, k_index_catch_up, default_flags);
  if (scan.added > 0 && tools::logs(tools::LogLevel::info))
    fmt::print(stderr, "INFO ||NEURON_CACHE||: content index: {} entries recorded\n", scan.added);
}

// A time as ls and gc print it: UTC, to the second, ISO 8601.
inline std::string utc_time(std::chrono::system_clock::time_point t) {
  return fmt::format("{:%Y-%m-%dT%H:%M:%SZ}", std::chrono::floor<std::chrono::seconds>(t));
}

// Registers the subcommand `name`: its Options live as long as the subcommand, and
// once the command line is parsed `check` (if any) may refuse them (by throwing a
// CLI::ValidationError) before `run` sets the exit code. Returns the subcommand and its
// Options, for the subcommand's own arguments.
template <class Options>
std::pair<CLI::App*, Options*> add_command(CLI::App& app, int& exit_code, std::string name, std::string description,
                                           int (*run)(const Options&), void (*check)(const Options&) = nullptr) {
  auto opts = std::make_shared<Options>();
  auto* sub = app.add_subcommand(std::move(name), std::move(description));
  sub->callback([opts, run, check, &exit_code] {
    if (check) check(*opts);
    exit_code = run(*opts);
  });
  return {sub, opts.get()};
}

inline void add_cache_option(CLI::App* sub, std::string& cache) {
  sub->add_option("--cache", cache, "cache directory (default: --cache_dir in NEURON_CC_FLAGS, "
                                    "NEURON_COMPILE_CACHE_URL, /var/tmp/neuron-compile-cache)");
}

// A subcommand on a cache (add_command), its --cache option first.
template <class Options>
std::pair<CLI::App*, Options*> add_cache_command(CLI::App& app, int& exit_code, std::string name,
                                                 std::string description, int (*run)(const Options&)) {
  auto [sub, opts] = add_command(app, exit_code, std::move(name), std::move(description), run);
  add_cache_option(sub, opts->cache);
  return {sub, opts};
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

// A graph's GraphInputs, read: its flags, the compiler version and the HLO file's bytes.
struct GraphData {
  ParsedFlags flags;
  std::string compiler_version;
  std::string bytes;
};

// The first of the three that cannot be had is the error.
inline Result<GraphData> read_graph(const GraphInputs& in) {
  auto flags = compiler_flags(in.flags);
  if (!flags) return flags.error();
  auto version = compiler_version(in.compiler_version, in.compiler);
  if (!version) return version.error();
  auto bytes = detail::read_file(in.hlo_file);
  if (!bytes) return bytes.error();
  return GraphData{std::move(*flags), std::move(*version), std::move(*bytes)};
}

}  // namespace neffcache::cli
