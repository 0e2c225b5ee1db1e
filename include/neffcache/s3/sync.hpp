// Copies between a directory cache and an S3 cache with the same layout of keys:
// push uploads a directory's entries, pull downloads a bucket's entries into a
// directory, so an ephemeral machine warms up in one command.
//
// Both keep the cache's one invariant on the receiving side: an entry's model.done (LNL:
// its .compilation_complete) is written only after its NEFF is whole there. Files the other side already has
// with the same size are skipped, so a repeated or interrupted sync resumes where it
// stopped. Locks, leases and our private files are not copied.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <neffcache/core/detail/fs.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/cache.hpp>

namespace neffcache {

struct SyncStats {
  std::size_t entries = 0;
  std::size_t copied = 0;   // files transferred
  std::size_t skipped = 0;  // files the other side had already
  uint64_t bytes = 0;       // bytes transferred
  std::vector<std::string> failures;  // one line per file that could not be copied
};

namespace detail {

// The files an entry of `files`' dialect is made of, in the order a copy must write
// them: inputs, then the logs, then the NEFF, and the done marker last.
inline std::vector<std::string> sync_order(const EntryFiles& files) {
  if (files.is_lnl())
    return {std::string(k_lnl_command_file), std::string(k_lnl_metadata_file), std::string(k_lnl_fxgraph_file),
            std::string(k_lnl_example_inputs_file),
            std::string(k_lnl_hlo_file), std::string(k_lnl_log_file), std::string(k_lnl_failure_file),
            files.neff_name(), std::string(k_lnl_marker_file)};
  return {std::string(k_compile_flags_file), std::string(k_hlo_module_file), std::string(k_hlo_legacy_file),
          std::string(k_log_file), std::string(k_neff_file), std::string(k_done_file)};
}

// Runs work(i) for i in [0, n) on `jobs` threads.
template <class F>
void run_parallel(std::size_t n, int jobs, F&& work) {
  std::atomic<std::size_t> next{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < std::max(1, jobs); ++t)
    threads.emplace_back([&] {
      for (std::size_t i; (i = next.fetch_add(1)) < n;) work(i);
    });
  for (auto& t : threads) t.join();
}

// One entry's files present on a side: name -> size.
using EntryListing = std::map<std::string, uint64_t, std::less<>>;

// Copies one entry's files in sync_order; `have` is what the target has already. The
// done marker goes only when the NEFF is there (copied now or before).
template <class Copy>
void sync_entry(const std::string& rel, const EntryListing& source, const EntryListing& have, Copy&& copy,
                SyncStats& stats, std::mutex& mu) {
  const EntryFiles files = EntryFiles::of_entry_path(rel);
  const std::string neff = files.neff_name();
  bool neff_ok = true;
  for (const std::string& name : sync_order(files)) {
    auto it = source.find(name);
    if (it == source.end()) continue;
    if (name == files.done_name() && (!neff_ok || !source.contains(neff))) continue;
    auto there = have.find(name);
    if (there != have.end() && there->second == it->second) {
      std::lock_guard lock(mu);
      ++stats.skipped;
      continue;
    }
    auto r = copy(fmt::format("{}/{}", rel, name));
    std::lock_guard lock(mu);
    if (!r) {
      stats.failures.push_back(r.error().message);
      if (name == neff) neff_ok = false;
      continue;
    }
    ++stats.copied;
    stats.bytes += it->second;
  }
}

// An S3 entry's objects as name -> size.
inline EntryListing sizes_of(const S3EntryObjects& objects) {
  EntryListing out;
  for (const auto& [name, o] : objects) out.emplace(name, o.size);
  return out;
}

// The files of the local entry at `rel` that a sync copies, opened as `dir_fd`.
inline EntryListing local_entry_files(std::string_view rel, int dir_fd) {
  EntryListing out;
  for (const std::string& name : sync_order(EntryFiles::of_entry_path(rel))) {
    struct stat st {};
    if (::fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
      out.emplace(name, static_cast<uint64_t>(st.st_size));
  }
  return out;
}

}  // namespace detail

// Uploads every entry of the directory cache `root` to `prefix` of the client's bucket.
inline Result<SyncStats> sync_push(const std::string& root, S3Client& s3, const std::string& prefix, int jobs = 8) {
  auto remote = s3.list(prefix.empty() ? "" : prefix + "/");
  if (!remote) return remote.error();
  std::map<std::string, detail::EntryListing> have;
  for (const auto& [rel, objects] : group_s3_entries(remote->objects, prefix)) have[rel] = detail::sizes_of(objects);
  std::vector<std::pair<std::string, detail::EntryListing>> local;
  auto walked = for_each_entry(root, [&](const EntryRef& e) {
    local.emplace_back(e.relative_path(), detail::local_entry_files(e.relative_path(), e.dir_fd));
  });
  if (!walked) return walked.error();
  SyncStats stats;
  stats.entries = local.size();
  std::mutex mu;
  static const detail::EntryListing none;
  detail::run_parallel(local.size(), jobs, [&](std::size_t i) {
    const auto& [rel, files] = local[i];
    auto it = have.find(rel);
    detail::sync_entry(rel, files, it == have.end() ? none : it->second,
                       [&](const std::string& file) -> Result<void> {
                         auto r = s3.upload(s3_key(prefix, file), fmt::format("{}/{}", root, file));
                         if (!r) return r.error();
                         return {};
                       },
                       stats, mu);
  });
  return stats;
}

// Downloads every entry under `prefix` of the client's bucket into the directory cache
// `root`, creating folders as needed.
inline Result<SyncStats> sync_pull(const std::string& root, S3Client& s3, const std::string& prefix, int jobs = 8) {
  auto remote = s3.list(prefix.empty() ? "" : prefix + "/");
  if (!remote) return remote.error();
  std::map<std::string, detail::EntryListing> entries;
  for (const auto& [rel, objects] : group_s3_entries(remote->objects, prefix)) entries[rel] = detail::sizes_of(objects);
  std::vector<const std::pair<const std::string, detail::EntryListing>*> work;
  for (const auto& e : entries) work.push_back(&e);
  SyncStats stats;
  stats.entries = work.size();
  std::mutex mu;
  detail::run_parallel(work.size(), jobs, [&](std::size_t i) {
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
    if (detail::UniqueFd fd(detail::open_dir_at(AT_FDCWD, dir.c_str())); fd) have = detail::local_entry_files(rel, fd.get());
    detail::sync_entry(rel, files, have,
                       [&](const std::string& file) -> Result<void> {
                         auto r = s3.download(s3_key(prefix, file), fmt::format("{}/{}", root, file));
                         if (!r) return r.error();
                         return {};
                       },
                       stats, mu);
  });
  return stats;
}

}  // namespace neffcache
