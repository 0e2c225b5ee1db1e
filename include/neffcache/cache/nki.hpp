// NKI side files: what a cache shared between hosts must carry besides its entries for a
// graph that calls NKI kernels to compile on another host.
//
// - Kernel binaries. A graph names each kernel it calls by absolute path inside its HLO
//   (hlo/detail/nki.hpp), under the kernel folder: /var/tmp/nki-intermediate-cache by
//   default, NEFFCACHE_NKI_KERNELS or an option for another. neuronx-cc reads the file
//   at that path, so another host needs it at the same path: a kernel is carried by its
//   path relative to the kernel folder, and one outside that folder cannot be carried.
// - LNL's NKI compile results, <root>/nki/<key>.json (no completion marker, no lock):
//   plain files, copied as they are.
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/hlo/hlo.hpp>

namespace neffcache {

inline constexpr std::string_view k_default_nki_kernel_dir = "/var/tmp/nki-intermediate-cache";
inline constexpr const char* k_nki_kernel_dir_env = "NEFFCACHE_NKI_KERNELS";
// LNL's NKI results folder in a cache root.
inline constexpr std::string_view k_lnl_nki_dir = "nki";

// The kernel folder this process carries kernels of: `NEFFCACHE_NKI_KERNELS`, else the
// default. (An empty variable counts as unset.)
inline std::string nki_kernel_dir() {
  return detail::getenv_or(k_nki_kernel_dir_env, std::string(k_default_nki_kernel_dir));
}

// Whether `rel` is a plain relative path: no empty, "." or ".." part, not absolute, no
// NUL. Only such a path (from a bucket listing, say) is joined to a local folder.
inline bool is_plain_relative_path(std::string_view rel) {
  if (rel.empty() || rel.front() == '/' || rel.find('\0') != std::string_view::npos) return false;
  for (std::size_t at = 0; at <= rel.size();) {
    auto end = rel.find('/', at);
    if (end == std::string_view::npos) end = rel.size();
    const auto part = rel.substr(at, end - at);
    if (part.empty() || part == "." || part == "..") return false;
    at = end + 1;
  }
  return true;
}

// The path of the kernel `kernel` (absolute, as a graph names it) relative to the kernel
// folder `dir`; nullopt when it lies outside, or is not a plain path (a graph naming
// /var/tmp/nki-intermediate-cache/../../etc/passwd carries nothing).
inline std::optional<std::string> kernel_relative_path(std::string_view dir, std::string_view kernel) {
  while (dir.size() > 1 && dir.back() == '/') dir.remove_suffix(1);
  if (dir.empty() || dir.front() != '/' || kernel.size() <= dir.size() + 1 || !kernel.starts_with(dir) ||
      (dir != "/" && kernel[dir.size()] != '/'))
    return std::nullopt;
  auto rel = kernel.substr(dir == "/" ? 1 : dir.size() + 1);
  if (!is_plain_relative_path(rel)) return std::nullopt;
  return std::string(rel);
}

// The kernel binaries the HLO file `hlo_path` calls (absolute paths, as it names them).
// Errors: the HLO cannot be read or parsed.
inline Result<std::set<std::string>> kernels_called(const std::string& hlo_path) {
  auto hlo = analyze_hlo_file(hlo_path);
  if (!hlo) return hlo.error();
  return std::move(hlo->stats.kernel_files);
}

}  // namespace neffcache
