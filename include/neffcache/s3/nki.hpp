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
// folder `kernel_dir` that the bucket lacks or holds with another size. `in_bucket`: the
// bucket's kernels as a listing gave them (nki_objects), else each is asked for with a
// HEAD. Errors: the first upload or request that failed (the caller must not publish an
// entry calling that kernel).
inline Result<KernelTransfer> push_nki_kernels(S3Client& s3, const std::string& prefix, const std::string& kernel_dir,
                                               const std::set<std::string>& kernels,
                                               const FileSizes* in_bucket = nullptr) {
  KernelTransfer t;
  for (const auto& kernel : kernels) {
    auto rel = kernel_relative_path(kernel_dir, kernel);
    if (!rel) {
      t.not_carried.push_back(fmt::format("the NKI kernel {} lies outside the kernel folder {}", kernel, kernel_dir));
      continue;
    }
    struct stat st {};
    if (::stat(kernel.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      t.not_carried.push_back(fmt::format("the NKI kernel {} is not on this host", kernel));
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
    if (auto up = s3.upload(key, kernel); !up) return up.error();
    ++t.copied;
    t.bytes += static_cast<uint64_t>(st.st_size);
  }
  return t;
}

// Downloads into the kernel folder `kernel_dir` the kernels of `kernels` (absolute
// paths) that are not on this host and that the bucket has; each appears whole or not
// at all. A kernel the bucket lacks too is left for the compile to refuse by name.
// Errors: a download or a folder that could not be made.
inline Result<KernelTransfer> fetch_nki_kernels(S3Client& s3, const std::string& prefix, const std::string& kernel_dir,
                                                const std::set<std::string>& kernels) {
  KernelTransfer t;
  for (const auto& kernel : kernels) {
    struct stat st {};
    if (::stat(kernel.c_str(), &st) == 0) {
      ++t.skipped;
      continue;
    }
    auto rel = kernel_relative_path(kernel_dir, kernel);
    if (!rel) {
      t.not_carried.push_back(fmt::format("the NKI kernel {} lies outside the kernel folder {}", kernel, kernel_dir));
      continue;
    }
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(kernel).parent_path(), ec);
    if (ec) return Error{Errc::io, fmt::format("create {}: {}", std::filesystem::path(kernel).parent_path().string(), ec.message())};
    auto got = s3.download(s3_key(prefix, fmt::format("{}/{}", k_s3_kernels_dir, *rel)), kernel);
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
