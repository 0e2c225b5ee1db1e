// Definitions of cache/key.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/key.hpp>

#include <sys/stat.h>

#include <cerrno>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL Result<EntryKey> entry_key(std::string_view hlo_bytes, const std::vector<std::string>& flags,
                                          std::string_view version,
                                          FlagsHashForm form,
                                          const CanonicalSink& dump) {
  if (auto v = check_compiler_version(version); !v) return v.error();
  auto hlo = analyze_hlo(hlo_bytes, dump);
  if (!hlo) return hlo.error();
  return EntryKey{std::string(version), hlo->graph_hash, flags_hash(flags, form)};
}

NEFFCACHE_DECL Result<std::string> make_entry_folder(const std::string& root, const EntryKey& key) {
  const std::string entry = fmt::format("{}/{}", root, key.relative_path());
  for (const auto& dir : {root, fmt::format("{}/{}", root, key.compiler_dir()), entry})
    if (sys::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return sys_error("create", dir);
  return entry;
}

NEFFCACHE_DECL Result<bool> store_graph(const std::string& entry_dir, std::string_view hlo_bytes,
                                        const std::vector<std::string>& flags) {
  auto files = read_entry_files(entry_dir);
  if (!files) return files.error();
  if (files->has_hlo()) return false;
  if (auto f = write_compile_flags(fmt::format("{}/{}", entry_dir, k_compile_flags_file), flags); !f) return f.error();
  if (auto h = detail::write_file_atomic(fmt::format("{}/{}", entry_dir, k_hlo_module_file), hlo_bytes); !h)
    return h.error();
  return true;
}

NEFFCACHE_DECL Result<std::string> parse_compiler_version(std::string_view output) {
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

NEFFCACHE_DECL Result<std::string> detect_compiler_version(const std::string& compiler) {
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
