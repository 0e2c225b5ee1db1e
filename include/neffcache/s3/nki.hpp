// NKI side files in an S3 cache (cache/nki.hpp says what they are):
//   <prefix>/.neffcache/nki-kernels/<path relative to the kernel folder>   a kernel binary
//   <prefix>/nki/<key>.json                                               LNL's NKI result
// Kernels go up before the entries that call them and come down before a compile that
// calls them, so that a host that sees an entry in the bucket can compile it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/nki.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/s3/client.hpp>

namespace neffcache {

inline constexpr std::string_view k_s3_kernels_dir = ".neffcache/nki-kernels";

// Sizes of files by their path relative to a folder.
using FileSizes = std::map<std::string, uint64_t, std::less<>>;

// The NKI side files of a bucket listing under `prefix`: kernels by their path relative
// to the kernel folder, LNL's results by their name in nki/. Keys that are no plain
// relative path are left out.
struct NkiObjects {
  FileSizes kernels;
  FileSizes results;
};

NEFFCACHE_DECL NkiObjects nki_objects(const std::vector<ObjectInfo>& objects, const std::string& prefix);

// What carrying kernels did: files moved, files the other side had (same size), and
// kernels that could not be carried because they are not on the sending side or lie
// outside the kernel folder (one line each; the graphs calling them compile only where
// the kernel is).
struct KernelTransfer {
  std::size_t copied = 0;
  std::size_t skipped = 0;
  uint64_t bytes = 0;
  std::vector<std::string> not_carried;
};

// Uploads the kernels `kernels` (absolute paths, as graphs name them) of the kernel
// folder `kernel_dir` that the bucket lacks or holds with another size; each is read
// beneath the folder, through no symbolic link (open_kernel). `in_bucket`: the bucket's
// kernels as a listing gave them (nki_objects), else each is asked for with a HEAD.
// Errors: the first upload or request that failed (the caller must not publish an entry
// calling that kernel).
NEFFCACHE_DECL Result<KernelTransfer> push_nki_kernels(S3Client& s3, const std::string& prefix,
                                                       const std::string& kernel_dir,
                                                       const std::set<std::string>& kernels,
                                                       const FileSizes* in_bucket = nullptr);

// Downloads the bucket's kernel at `rel` (a plain relative path) beneath the kernel folder
// open as `dir_fd`, its folders made as needed through no symbolic link (kernel_parent);
// it appears whole or not at all. Errors: as the download's, or a folder's.
NEFFCACHE_DECL Result<ObjectInfo> download_kernel(S3Client& s3, const std::string& prefix, int dir_fd,
                                                  const std::string& rel);

// Downloads into the kernel folder `kernel_dir` (made if missing) the kernels of
// `kernels` (absolute paths) that are not on this host and that the bucket has
// (download_kernel). A kernel the bucket lacks too is left for the compile to refuse by
// name. Errors: a download or a folder that could not be made.
NEFFCACHE_DECL Result<KernelTransfer> fetch_nki_kernels(S3Client& s3, const std::string& prefix,
                                                        const std::string& kernel_dir,
                                                        const std::set<std::string>& kernels);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/nki.ipp>
#endif
