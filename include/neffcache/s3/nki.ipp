// Definitions of s3/nki.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/nki.hpp>

#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <system_error>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL NkiObjects nki_objects(const std::vector<ObjectInfo>& objects, const std::string& prefix) {
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

NEFFCACHE_DECL Result<KernelTransfer> push_nki_kernels(S3Client& s3, const std::string& prefix,
                                                       const std::string& kernel_dir,
                                                       const std::set<std::string>& kernels,
                                                       const FileSizes* in_bucket) {
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

NEFFCACHE_DECL Result<ObjectInfo> download_kernel(S3Client& s3, const std::string& prefix, int dir_fd,
                                                  const std::string& rel) {
  auto parent = kernel_parent(dir_fd, rel);
  if (!parent) return parent.error();
  const auto name = rel.substr(rel.rfind('/') == std::string::npos ? 0 : rel.rfind('/') + 1);
  // (The download's temporary file and rename stay in the folder open as `parent`.)
  return s3.download(s3_key(prefix, fmt::format("{}/{}", k_s3_kernels_dir, rel)),
                     fmt::format("/proc/self/fd/{}/{}", parent->get(), name));
}

NEFFCACHE_DECL Result<KernelTransfer> fetch_nki_kernels(S3Client& s3, const std::string& prefix,
                                                        const std::string& kernel_dir,
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
