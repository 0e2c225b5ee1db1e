// Cache keys: where in the cache a graph compiled with given flags by a given
// compiler lives, how to put it there, and how to find out which compiler version is
// installed.
#pragma once

#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/process.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/hlo/hlo.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

inline constexpr std::string_view k_default_compiler = "neuronx-cc";
inline constexpr std::chrono::seconds k_version_query_timeout{30};

// The key of a serialized HLO compiled with `flags` (wrapper options already removed)
// by compiler `version`. Errors: a bad version, or bytes that are not HLO.
NEFFCACHE_DECL Result<EntryKey> entry_key(std::string_view hlo_bytes, const std::vector<std::string>& flags,
                                          std::string_view version,
                                          FlagsHashForm form = FlagsHashForm::json,
                                          const CanonicalSink& dump = {});

// Creates the folders of `key`'s entry under `root` as needed; returns the entry folder.
NEFFCACHE_DECL Result<std::string> make_entry_folder(const std::string& root, const EntryKey& key);

// Stores a graph in its entry folder as graph extraction does: compile_flags.json,
// then the HLO, each written whole, so whoever sees the HLO sees a complete job. An
// entry that has its HLO already holds this very graph (the key says so) and is left
// as it is, whatever its state: the result says whether anything was written.
NEFFCACHE_DECL Result<bool> store_graph(const std::string& entry_dir, std::string_view hlo_bytes,
                                        const std::vector<std::string>& flags);

// Picks the version out of `<compiler> --version` output such as
// "NeuronX Compiler version 2.21.0.0+b0d7f0f4": the first word after "version" that
// starts with a digit. Output without one is an Errc::invalid_argument error.
NEFFCACHE_DECL Result<std::string> parse_compiler_version(std::string_view output);

// Asks the installed compiler for its version (`<compiler> --version`).
NEFFCACHE_DECL Result<std::string> detect_compiler_version(
    const std::string& compiler = std::string(k_default_compiler));

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/key.ipp>
#endif
