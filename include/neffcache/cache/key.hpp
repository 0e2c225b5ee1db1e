// Cache keys: where in the cache a graph compiled with given flags by a given
// compiler lives, how to put it there, and how to find out which compiler version is
// installed.
#pragma once

#include <sys/stat.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

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
inline Result<EntryKey> entry_key(std::string_view hlo_bytes, const std::vector<std::string>& flags,
                                  std::string_view version,
                                  FlagsHashForm form = FlagsHashForm::json,
                                  const CanonicalSink& dump = {}) {
  if (auto v = check_compiler_version(version); !v) return v.error();
  auto hlo = analyze_hlo(hlo_bytes, dump);
  if (!hlo) return hlo.error();
  return EntryKey{std::string(version), hlo->graph_hash, flags_hash(flags, form)};
}

// Creates the folders of `key`'s entry under `root` as needed; returns the entry folder.
inline Result<std::string> make_entry_folder(const std::string& root, const EntryKey& key) {
  const std::string entry = fmt::format("{}/{}", root, key.relative_path());
  for (const auto& dir : {root, fmt::format("{}/{}", root, key.compiler_dir()), entry})
    if (sys::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return sys_error("create", dir);
  return entry;
}

// Stores a graph in its entry folder as graph extraction does: compile_flags.json,
// then the HLO, each written whole, so whoever sees the HLO sees a complete job. An
// entry that has its HLO already holds this very graph (the key says so) and is left
// as it is, whatever its state: the result says whether anything was written.
inline Result<bool> store_graph(const std::string& entry_dir, std::string_view hlo_bytes,
                                const std::vector<std::string>& flags) {
  auto files = read_entry_files(entry_dir);
  if (!files) return files.error();
  if (files->has_hlo()) return false;
  if (auto f = write_compile_flags(fmt::format("{}/{}", entry_dir, k_compile_flags_file), flags); !f) return f.error();
  if (auto h = detail::write_file_atomic(fmt::format("{}/{}", entry_dir, k_hlo_module_file), hlo_bytes); !h)
    return h.error();
  return true;
}

// Picks the version out of `<compiler> --version` output such as
// "NeuronX Compiler version 2.21.0.0+b0d7f0f4": the first word after "version" that
// starts with a digit. Output without one is an Errc::invalid_argument error.
inline Result<std::string> parse_compiler_version(std::string_view output) {
  for (std::size_t at = output.find("version"); at != std::string_view::npos;
       at = output.find("version", at + 1)) {
    std::size_t b = output.find_first_not_of(" \t:", at + 7);
    if (b == std::string_view::npos || output[b] < '0' || output[b] > '9') continue;
    std::size_t e = output.find_first_of(" \t\r\n,", b);
    std::string v(output.substr(b, e == std::string_view::npos ? e : e - b));
    if (check_compiler_version(v)) return v;
  }
  return Error{Errc::invalid_argument, "no version number in the compiler's --version output"};
}

// Asks the installed compiler for its version (`<compiler> --version`).
inline Result<std::string> detect_compiler_version(const std::string& compiler = std::string(k_default_compiler)) {
  auto run = detail::run_capture({compiler, "--version"}, k_version_query_timeout);
  if (!run) {
    if (run.error().sys_errno == ENOENT)
      return Error{Errc::not_found, fmt::format("compiler '{}' not found on PATH", compiler)};
    return run.error();
  }
  if (run->exit_code != 0)
    return Error{Errc::io, fmt::format("'{} --version' exited with status {}", compiler, run->exit_code)};
  auto v = parse_compiler_version(run->output);
  if (!v) return Error{v.error().code, fmt::format("{}: {}", compiler, v.error().message)};
  return v;
}

}  // namespace neffcache
