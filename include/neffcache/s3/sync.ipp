// Definitions of s3/sync.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/sync.hpp>

#include <fcntl.h>
#include <sys/stat.h>

#include <filesystem>
#include <optional>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::vector<std::string> sync_order(const EntryFiles& files) {
  if (files.is_lnl())
    return {std::string(k_lnl_command_file), std::string(k_lnl_metadata_file), std::string(k_lnl_fxgraph_file),
            std::string(k_lnl_example_inputs_file),
            std::string(k_lnl_hlo_file), std::string(k_lnl_log_file), std::string(k_lnl_failure_file),
            files.neff_name(), std::string(k_lnl_marker_file)};
  return {std::string(k_compile_flags_file), std::string(k_hlo_module_file), std::string(k_hlo_legacy_file),
          std::string(k_log_file), std::string(k_neff_file), std::string(k_done_file)};
}

NEFFCACHE_DECL FileSizes local_nki_results(const std::string& root) {
  FileSizes out;
  const std::string dir = fmt::format("{}/{}", root, k_lnl_nki_dir);
  const int fd = open_dir_at(AT_FDCWD, dir.c_str());
  if (fd < 0) return out;
  (void)list_dir(fd, dir, [&](std::string_view name, bool is_dir) {
    struct stat st {};
    if (!is_dir && !name.starts_with('.') && ::lstat(fmt::format("{}/{}", dir, name).c_str(), &st) == 0 &&
        S_ISREG(st.st_mode))
      out.emplace(std::string(name), static_cast<uint64_t>(st.st_size));
  });
  return out;
}

NEFFCACHE_DECL EntryListing local_entry_files(std::string_view rel, int dir_fd) {
  EntryListing out;
  const EntryFiles files = EntryFiles::of_entry_path(rel);
  for (const std::string& name : sync_order(files)) {
    struct stat st {};
    // (An LNL failure record is looked for where it is kept now, and where an earlier
    // version kept it.)
    const bool found = (files.is_lnl() && name == k_lnl_failure_file &&
                        ::fstatat(dir_fd, own_failure_from_entry(files).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0) ||
                       ::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0;
    if (found && S_ISREG(st.st_mode)) out.emplace(name, static_cast<uint64_t>(st.st_size));
  }
  return out;
}

NEFFCACHE_DECL std::string local_file(const std::string& root, std::string_view file, LocalUse use) {
  const auto slash = file.rfind('/');
  if (slash == std::string_view::npos || file.substr(slash + 1) != k_lnl_failure_file)
    return fmt::format("{}/{}", root, file);
  const std::string entry = fmt::format("{}/{}", root, file.substr(0, slash));
  if (!EntryFiles::of_entry_path(entry).is_lnl()) return fmt::format("{}/{}", root, file);
  if (use == LocalUse::read) return failure_record(entry);
  const OwnFiles own = own_files(entry);
  (void)own.make();  // (a folder that cannot be made fails the download, which says why)
  return own.failure;
}

}  // namespace detail

NEFFCACHE_DECL Result<SyncStats> sync_push(const std::string& root, S3Client& s3, const std::string& prefix,
                                           const SyncSettings& o) {
  auto remote = s3.list(prefix.empty() ? "" : prefix + "/");
  if (!remote) return remote.error();
  std::map<std::string, detail::EntryListing> have;
  for (const auto& [rel, objects] : group_s3_entries(remote->objects, prefix)) have[rel] = detail::sizes_of(objects);
  const NkiObjects nki = nki_objects(remote->objects, prefix);
  std::vector<std::pair<std::string, detail::EntryListing>> local;
  auto walked = for_each_entry(root, [&](const EntryRef& e) {
    local.emplace_back(e.relative_path(), detail::local_entry_files(e.relative_path(), e.dir_fd));
  });
  if (!walked) return walked.error();
  SyncStats stats;
  stats.entries = local.size();
  std::mutex mu;
  detail::sync_files(detail::local_nki_results(root), nki.results, o.jobs,
                     [&](const std::string& name) -> Result<void> {
                       const std::string rel = fmt::format("{}/{}", k_lnl_nki_dir, name);
                       auto r = s3.upload(s3_key(prefix, rel), fmt::format("{}/{}", root, rel));
                       if (!r) return r.error();
                       return {};
                     },
                     stats, mu);
  // Kernels go up one at a time (a graph calls few, and many graphs call the same), each
  // once: what became of a kernel is kept, so its other callers wait for it or skip.
  std::mutex kernels_mu;  // taken before mu, never inside it
  std::map<std::string, std::optional<std::string>, std::less<>> kernel_errors;
  auto push_kernels = [&](const std::string& rel, const detail::EntryListing& listing) -> Result<void> {
    EntryFiles files = EntryFiles::of_entry_path(rel);
    for (const auto& [name, size] : listing) files.note(name);
    auto hlo = files.hlo_name();
    if (!hlo) return {};
    auto called = kernels_called(fmt::format("{}/{}/{}", root, rel, *hlo));
    if (!called) return {};  // an unreadable HLO calls nothing we can name; it still goes up
    std::lock_guard klock(kernels_mu);
    for (const auto& kernel : *called) {
      auto known = kernel_errors.find(kernel);
      if (known == kernel_errors.end()) {
        auto t = push_nki_kernels(s3, prefix, o.nki_kernels, {kernel}, &nki.kernels);
        std::lock_guard lock(mu);
        if (!t) {
          known = kernel_errors.emplace(kernel, t.error().message).first;
        } else {
          known = kernel_errors.emplace(kernel, std::nullopt).first;
          stats.copied += t->copied;
          stats.skipped += t->skipped;
          stats.bytes += t->bytes;
          for (auto& line : t->not_carried) stats.warnings.push_back(fmt::format("{} (called by {})", line, rel));
        }
      }
      if (known->second)
        return Error{Errc::io, fmt::format("{}: not pushed: its NKI kernel {} could not be uploaded: {}", rel, kernel,
                                           *known->second)};
    }
    return {};
  };
  static const detail::EntryListing none;
  detail::run_parallel(local.size(), o.jobs, [&](std::size_t i) {
    const auto& [rel, files] = local[i];
    auto it = have.find(rel);
    const auto& there = it == have.end() ? none : it->second;
    if (!detail::needs_copy(files, there)) {
      std::lock_guard lock(mu);
      stats.skipped += files.size();
      return;
    }
    if (auto k = push_kernels(rel, files); !k) {
      std::lock_guard lock(mu);
      stats.failures.push_back(k.error().message);
      return;
    }
    const bool whole = detail::sync_entry(rel, files, there,
                                          [&](const std::string& file) -> Result<void> {
                                            auto r = s3.upload(s3_key(prefix, file), detail::local_file(root, file));
                                            if (!r) return r.error();
                                            return {};
                                          },
                                          stats, mu);
    // Once every file went up: recorded in the bucket's content index as a compile there
    // would be (best effort: `neffcache index` adds what is missing).
    const bool neff = files.contains(std::string(k_neff_file));
    if (whole && S3Index::indexes(rel) && (files.contains(std::string(k_done_file)) ||
                                  (!neff && files.contains(std::string(k_log_file))))) {
      const std::string dir = fmt::format("{}/{}", root, rel);
      const auto meta = detail::read_entry_meta(dir);
      const double seconds = meta.contains("compile_seconds") && meta["compile_seconds"].is_number()
                                 ? meta["compile_seconds"].get<double>()
                                 : 0.0;
      if (auto id = entry_content_id(dir)) (void)S3Index(s3, prefix).add(*id, rel, !neff, {}, seconds);
    }
  });
  return stats;
}

NEFFCACHE_DECL Result<SyncStats> sync_pull(const std::string& root, S3Client& s3, const std::string& prefix,
                                           const SyncSettings& o) {
  auto remote = s3.list(prefix.empty() ? "" : prefix + "/");
  if (!remote) return remote.error();
  std::map<std::string, detail::EntryListing> entries;
  for (const auto& [rel, objects] : group_s3_entries(remote->objects, prefix)) entries[rel] = detail::sizes_of(objects);
  const NkiObjects nki = nki_objects(remote->objects, prefix);
  SyncStats stats;
  std::mutex mu;
  if (!nki.kernels.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(o.nki_kernels, ec);
    auto kernel_dir = open_kernel_dir(o.nki_kernels);
    if (!kernel_dir) {
      // The entries still come: only the kernels fail.
      stats.failures.push_back(kernel_dir.error().message);
    } else {
      FileSizes kernels_here;
      for (const auto& [rel, size] : nki.kernels)
        if (auto fd = open_kernel(kernel_dir->get(), rel)) {
          struct stat st {};
          if (::fstat(fd->get(), &st) == 0) kernels_here.emplace(rel, static_cast<uint64_t>(st.st_size));
        }
      detail::sync_files(nki.kernels, kernels_here, o.jobs,
                         [&](const std::string& rel) -> Result<void> {
                           auto r = download_kernel(s3, prefix, kernel_dir->get(), rel);
                           if (!r) return r.error();
                           return {};
                         },
                         stats, mu);
    }
  }
  if (!nki.results.empty()) {
    const std::string results = fmt::format("{}/{}", root, k_lnl_nki_dir);
    std::error_code ec;
    std::filesystem::create_directories(results, ec);
    if (ec) return Error{Errc::io, fmt::format("create {}: {}", results, ec.message())};
    // (nki_objects took only plain names: each stays in the folder.)
    detail::sync_files(nki.results, detail::local_nki_results(root), o.jobs,
                       [&](const std::string& name) -> Result<void> {
                         const std::string rel = fmt::format("{}/{}", k_lnl_nki_dir, name);
                         auto r = s3.download(s3_key(prefix, rel), fmt::format("{}/{}", root, rel));
                         if (!r) return r.error();
                         return {};
                       },
                       stats, mu);
  }
  std::vector<const std::pair<const std::string, detail::EntryListing>*> work;
  for (const auto& e : entries) work.push_back(&e);
  stats.entries = work.size();
  detail::run_parallel(work.size(), o.jobs, [&](std::size_t i) {
    const auto& [rel, files] = *work[i];
    std::string dir = fmt::format("{}/{}", root, rel);
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);
    if (ec) {
      std::lock_guard lock(mu);
      stats.failures.push_back(fmt::format("create {}: {}", dir, ec.message()));
      return;
    }
    detail::EntryListing have;
    if (detail::UniqueFd fd(detail::open_dir_at(AT_FDCWD, dir.c_str())); fd)
      have = detail::local_entry_files(rel, fd.get());
    detail::sync_entry(rel, files, have,
                       [&](const std::string& file) -> Result<void> {
                         auto r = s3.download(s3_key(prefix, file), detail::local_file(root, file, detail::LocalUse::write));
                         if (!r) return r.error();
                         return {};
                       },
                       stats, mu);
  });
  return stats;
}

}  // namespace neffcache
