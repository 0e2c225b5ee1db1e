// neffcache gc --max-size SIZE [--keep-compilers N] [--dry-run]: evict least recently
// used done entries until the cache fits; drop the trees of old compilers.
#include "neffcache/cmd_gc.hpp"

#include <unistd.h>

#include <memory>
#include <set>

#include <fmt/format.h>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/core/size.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_gc(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(
      app, exit_code, "gc",
      "Evict least recently used done entries until the cache fits in --max-size; drop old compiler trees", run_gc);
  sub->add_option("--max-size", opts->max_size, "the size to fit in, e.g. 500G")->required();
  sub->add_option("--keep-compilers", opts->keep_compilers,
                  "keep the entries of only the N most recently used compiler versions (default 0: all)")
      ->check(CLI::NonNegativeNumber);
  sub->add_flag("--dry-run", opts->dry_run, "print what would be removed, remove nothing");
}

int run_gc(const GcOptions& opts) {
  auto max = parse_size(opts.max_size);
  if (!max) return report(fmt::format("--max-size '{}' is not a size like 500G", opts.max_size));
  auto listed = open_listed(opts.cache, Access::change);
  if (!listed) return report(listed.error());
  const auto& [cache, entries] = *listed;
  uint64_t total = 0;
  for (const auto& e : entries) total += e.bytes;
  uint64_t freed = 0;
  std::size_t removed = 0;
  std::set<std::string> compiler_dirs;
  for (auto i : plan_gc(entries, *max, opts.keep_compilers)) {
    const auto& e = entries[i];
    if (!opts.dry_run) {
      if (auto r = cache->remove(cache->entry(e)); !r) {
        fmt::print(stderr, "neffcache: left {} alone: {}\n", e.path, r.error().message);
        continue;
      }
      compiler_dirs.insert(cache->entry(e).compiler_dir());
    }
    fmt::print("{} {} ({}, last used {})\n", opts.dry_run ? "would remove" : "removed", e.path, format_size(e.bytes), utc_time(e.last_use));
    freed += e.bytes;
    ++removed;
  }
  cache->remove_empty_compiler_dirs(compiler_dirs);
  fmt::print("{} {} entries ({}); the cache {} {} (limit {})\n", opts.dry_run ? "would remove" : "removed", removed,
             format_size(freed), opts.dry_run ? "would hold" : "holds", format_size(total - freed), format_size(*max));
  if (total - freed > *max)
    fmt::print(stderr, "neffcache: the cache is still over the limit: what is left is not done, or in use\n");
  return k_exit_ok;
}

}  // namespace neffcache::cli
