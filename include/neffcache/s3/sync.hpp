// Copies between a directory cache and an S3 cache with the same layout of keys:
// push uploads a directory's entries, pull downloads a bucket's entries into a
// directory, so an ephemeral machine warms up in one command.
//
// Both keep the cache's one invariant on the receiving side: an entry's model.done (LNL:
// its .compilation_complete) is written only after its NEFF is whole there. Files the other side already has
// with the same size are skipped, so a repeated or interrupted sync resumes where it
// stopped. Locks, leases and our private files are not copied.
//
// NKI side files (s3/nki.hpp) travel too: LNL's <root>/nki/ results, and the kernel
// binaries that graphs call, from and to the kernel folder. A push uploads the kernels an
// entry calls before the entry; an entry whose kernel could not be uploaded is not
// pushed. A pull downloads every kernel of the bucket before any entry.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/s3/client.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/index.hpp>
#include <neffcache/s3/nki.hpp>

namespace neffcache {

struct SyncStats {
  std::size_t entries = 0;
  std::size_t copied = 0;   // files transferred
  std::size_t skipped = 0;  // files the other side had already
  uint64_t bytes = 0;       // bytes transferred
  std::vector<std::string> failures;  // one line per file that could not be copied
  // One line per NKI kernel that an entry calls but that could not be carried (not on
  // the sending side, or outside the kernel folder): the entry still went, and compiles
  // only where the kernel is.
  std::vector<std::string> warnings;
};

// Where a sync finds and puts NKI kernels.
struct SyncSettings {
  int jobs = 8;  // transfers at a time
  std::string nki_kernels = nki_kernel_dir();  // the kernel folder
};

namespace detail {

// The files an entry of `files`' dialect is made of, in the order a copy must write
// them: inputs, then the logs, then the NEFF, and the done marker last.
NEFFCACHE_DECL std::vector<std::string> sync_order(const EntryFiles& files);

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
// done marker goes only when the NEFF is there (copied now or before). True when every
// file that had to go went.
template <class Copy>
bool sync_entry(const std::string& rel, const EntryListing& source, const EntryListing& have, Copy&& copy,
                SyncStats& stats, std::mutex& mu) {
  const EntryFiles files = EntryFiles::of_entry_path(rel);
  const std::string neff = files.neff_name();
  bool neff_ok = true, all_ok = true;
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
      all_ok = false;
      continue;
    }
    ++stats.copied;
    stats.bytes += it->second;
  }
  return all_ok;
}

// Whether sync_entry would copy anything of `source` that `have` lacks.
inline bool needs_copy(const EntryListing& source, const EntryListing& have) {
  for (const auto& [name, size] : source)
    if (auto it = have.find(name); it == have.end() || it->second != size) return true;
  return false;
}

// Copies the files of `source` (name -> size) that `have` lacks or has with another
// size, in parallel; each a line in `stats.failures` if it fails.
template <class Copy>
void sync_files(const FileSizes& source, const FileSizes& have, int jobs, Copy&& copy, SyncStats& stats,
                std::mutex& mu) {
  std::vector<const std::pair<const std::string, uint64_t>*> todo;
  for (const auto& f : source)
    if (auto it = have.find(f.first); it != have.end() && it->second == f.second) ++stats.skipped;
    else todo.push_back(&f);
  run_parallel(todo.size(), jobs, [&](std::size_t i) {
    auto r = copy(todo[i]->first);
    std::lock_guard lock(mu);
    if (!r) return stats.failures.push_back(r.error().message);
    ++stats.copied;
    stats.bytes += todo[i]->second;
  });
}

// LNL's NKI results in `root`/nki: name -> size (none when there is no such folder).
NEFFCACHE_DECL FileSizes local_nki_results(const std::string& root);

// An S3 entry's objects as name -> size.
inline EntryListing sizes_of(const S3EntryObjects& objects) {
  EntryListing out;
  for (const auto& [name, o] : objects) out.emplace(name, o.size);
  return out;
}

// The files of the local entry at `rel` that a sync copies, opened as `dir_fd`, by the
// names they have in a bucket.
NEFFCACHE_DECL EntryListing local_entry_files(std::string_view rel, int dir_fd);

// Where the file `file` (an entry path, '/', the file's name in a bucket) of the cache
// `root` is kept locally: in its entry folder, but for an LNL entry's failure record,
// which a bucket keeps in the entry (k_lnl_failure_file) and a folder with our own files
// (own_files, layout.hpp): to read, where it is (failure_record); to write, where it goes,
// its folder made.
enum class LocalUse { read, write };
NEFFCACHE_DECL std::string local_file(const std::string& root, std::string_view file, LocalUse use = LocalUse::read);

}  // namespace detail

// Uploads LNL's NKI results and every entry of the directory cache `root` to `prefix` of
// the client's bucket, each entry after the kernels it calls (see the top).
NEFFCACHE_DECL Result<SyncStats> sync_push(const std::string& root, S3Client& s3, const std::string& prefix,
                                           const SyncSettings& o = {});

// Downloads every NKI kernel under `prefix` of the client's bucket into the kernel
// folder, LNL's NKI results into `root`/nki, then every entry into the directory cache
// `root`, creating folders as needed.
NEFFCACHE_DECL Result<SyncStats> sync_pull(const std::string& root, S3Client& s3, const std::string& prefix,
                                           const SyncSettings& o = {});

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/sync.ipp>
#endif
