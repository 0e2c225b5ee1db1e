// NKI side files in an S3 cache (cache/nki.hpp says what they are):
//   <prefix>/.neffcache/nki-kernels/<path relative to the kernel folder>   a kernel binary
//   <prefix>/nki/<key>.json                                               LNL's NKI result
// Kernels go up before the entries that call them and come down before a compile that
// calls them, so that a host that sees an entry in the bucket can compile it.
#pragma once

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <neffcache/cache/nki.hpp>
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

inline NkiObjects nki_objects(const std::vector<ObjectInfo>& objects, const std::string& prefix) {
  NkiObjects out;
  const std::size_t skip = prefix.empty() ? 0 : prefix.size() + 1;
  const std::string kernels = fmt::format("{}/", k_s3_kernels_dir), results = fmt::format("{}/", k_lnl_nki_dir);
  for (const auto& o : objects) {
    if (o.key.size() <= skip) continue;
    std::string_view rel = std::string_view(o.key).substr(skip);
    if (rel.starts_with(kernels) && is_plain_relative_path(rel.substr(kernels.size())))
      out.kernels.emplace(std::string(rel.substr(kernels.size())), o.size);
    else if (rel.starts_with(results) && rel.find('/', results.size()) == std::string_view::npos &&
             is_plain_relative_path(rel.substr(results.size())))
      out.results.emplace(std::string(rel.substr(results.size())), o.size);
  }
  return out;
}

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
inline Result<KernelTransfer> push_nki_kernels(S3Client& s3, const std::string& prefix, const std::string& kernel_dir,
                                               const std::set<std::string>& kernels,
                                               const FileSizes* in_bucket = nullptr) {
  KernelTransfer t;
  if (kernels.empty()) return t;
  auto dir = open_kernel_dir(kernel_dir);
  for (const auto& kernel : kernels) {
    auto rel = kernel_relative_path(kernel_dir, kernel);
    if (!rel) {
      t.not_carried.push_back(fmt::format("the NKI kernel {} lies outside the kernel folder {}", kernel, kernel_dir));
      continue;
    }
    auto fd = dir ? open_kernel(dir->get(), *rel) : Result<detail::UniqueFd>(dir.error());
    struct stat st {};
    if (!fd || ::fstat(fd->get(), &st) != 0) {
      t.not_carried.push_back(fmt::format("the NKI kernel {} is not on this host ({})", kernel,
                                          fd ? "cannot stat it" : fd.error().message));
      continue;
    }
    const std::string key = s3_key(prefix, fmt::format("{}/{}", k_s3_kernels_dir, *rel));
    std::optional<uint64_t> there;
    if (in_bucket) {
      if (auto it = in_bucket->find(*rel); it != in_bucket->end()) there = it->second;
    } else if (auto h = s3.head(key)) {
      there = h->size;
    } else if (h.error().code != Errc::not_found) {
      return h.error();
    }
    if (there == static_cast<uint64_t>(st.st_size)) {
      ++t.skipped;
      continue;
    }
    // (Uploaded from the descriptor opened above: the very file checked.)
    if (auto up = s3.upload_fd(key, fd->get(), static_cast<uint64_t>(st.st_size)); !up) return up.error();
    ++t.copied;
    t.bytes += static_cast<uint64_t>(st.st_size);
  }
  return t;
}

// Downloads the bucket's kernel at `rel` (a plain relative path) beneath the kernel folder
// open as `dir_fd`, its folders made as needed through no symbolic link (kernel_parent);
// it appears whole or not at all. Errors: as the download's, or a folder's.
inline Result<ObjectInfo> download_kernel(S3Client& s3, const std::string& prefix, int dir_fd, const std::string& rel) {
  auto parent = kernel_parent(dir_fd, rel);
  if (!parent) return parent.error();
  const auto name = rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1);
  // (The download's temporary file and rename stay in the folder open as `parent`.)
  return s3.download(s3_key(prefix, fmt::format("{}/{}", k_s3_kernels_dir, rel)),
                     fmt::format("/proc/self/fd/{}/{}", parent->get(), name));
}

// Downloads into the kernel folder `kernel_dir` (made if missing) the kernels of
// `kernels` (absolute paths) that are not on this host and that the bucket has
// (download_kernel). A kernel the bucket lacks too is left for the compile to refuse by
// name. Errors: a download or a folder that could not be made.
inline Result<KernelTransfer> fetch_nki_kernels(S3Client& s3, const std::string& prefix, const std::string& kernel_dir,
                                                const std::set<std::string>& kernels) {
  KernelTransfer t;
  std::optional<detail::UniqueFd> dir;
  for (const auto& kernel : kernels) {
    struct stat st {};
    if (::lstat(kernel.c_str(), &st) == 0) {
      ++t.skipped;
      continue;
    }
    auto rel = kernel_relative_path(kernel_dir, kernel);
    if (!rel) {
      t.not_carried.push_back(fmt::format("the NKI kernel {} lies outside the kernel folder {}", kernel, kernel_dir));
      continue;
    }
    if (!dir) {
      std::error_code ec;
      std::filesystem::create_directories(kernel_dir, ec);
      auto opened = open_kernel_dir(kernel_dir);
      if (!opened) return opened.error();
      dir = std::move(*opened);
    }
    auto got = download_kernel(s3, prefix, dir->get(), *rel);
    if (!got) {
      if (got.error().code == Errc::not_found) {
        t.not_carried.push_back(fmt::format("the NKI kernel {} is neither on this host nor in the bucket", kernel));
        continue;
      }
      return got.error();
    }
    ++t.copied;
    t.bytes += got->size;
  }
  return t;
}

}  // namespace neffcache
