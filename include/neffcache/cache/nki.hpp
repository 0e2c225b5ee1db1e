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

#include <neffcache/core/decl.hpp>
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
NEFFCACHE_DECL bool is_plain_relative_path(std::string_view rel);

// The path of the kernel `kernel` (absolute, as a graph names it) relative to the kernel
// folder `dir`; nullopt when it lies outside, or is not a plain path (a graph naming
// /var/tmp/nki-intermediate-cache/../../etc/passwd carries nothing).
NEFFCACHE_DECL std::optional<std::string> kernel_relative_path(std::string_view dir, std::string_view kernel);

// The kernel folder `dir`, opened (the folder itself may not be a symbolic link), so that
// kernels are reached beneath it only (open_kernel, kernel_parent). Errors: no such folder.
NEFFCACHE_DECL Result<detail::UniqueFd> open_kernel_dir(const std::string& dir);

namespace detail {

// The folder holding `rel` (a plain relative path) beneath the folder open as `dir_fd`,
// reached one part at a time with O_NOFOLLOW (so through no symbolic link, and, with no
// ".." in a plain path, never out of it), each part made first (mode 0755 less the umask)
// when `create`. Errors: a part is missing (unless made), a link, or no folder.
NEFFCACHE_DECL Result<UniqueFd> walk_beneath(int dir_fd, std::string_view rel, bool create);

}  // namespace detail

// Opens the kernel at `rel` (kernel_relative_path) beneath the kernel folder open as
// `dir_fd` for reading, following no symbolic link on the way (detail::walk_beneath), so
// that a link planted in a shared kernel folder never makes us read (and upload) a file
// outside it; a FIFO there never blocks the open. Errors: it is missing, reached through
// a link, or not a regular file.
NEFFCACHE_DECL Result<detail::UniqueFd> open_kernel(int dir_fd, const std::string& rel);

// The folder that holds the kernel `rel` beneath the kernel folder open as `dir_fd`,
// made as needed through no symbolic link (detail::walk_beneath): what a kernel is
// written into. Errors: a part cannot be made or is a link.
inline Result<detail::UniqueFd> kernel_parent(int dir_fd, std::string_view rel) {
  return detail::walk_beneath(dir_fd, rel, /*create=*/true);
}

// The kernel binaries the HLO file `hlo_path` calls (absolute paths, as it names them).
// Errors: the HLO cannot be read or parsed.
inline Result<std::set<std::string>> kernels_called(const std::string& hlo_path) {
  auto hlo = analyze_hlo_file(hlo_path);
  if (!hlo) return hlo.error();
  return std::move(hlo->stats.kernel_files);
}

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/nki.ipp>
#endif
