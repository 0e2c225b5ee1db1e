// neffcache clear-neffs: remove compiled results (NEFFs and failure logs) and keep the
// graphs, so every entry is pending again.
#include "neffcache/cmd_clear_neffs.hpp"

#include <memory>

#include <fmt/format.h>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/maintenance.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_clear_neffs(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ClearNeffsOptions>();
  auto* sub = app.add_subcommand(
      "clear-neffs", "Remove compiled NEFFs and failure logs, keeping the graphs: every entry is pending again");
  add_cache_option(sub, opts->cache);
  sub->callback([opts, &exit_code] { exit_code = run_clear_neffs(*opts); });
}

int run_clear_neffs(const ClearNeffsOptions& opts) {
  auto cache = MaintainedCache::open(opts.cache);
  if (!cache) return report(cache.error());
  auto entries = cache->entries();
  if (!entries) return report(entries.error());
  std::size_t cleared = 0, left = 0;
  for (const auto& e : *entries) {
    if (e.state != EntryState::done && e.state != EntryState::failed) continue;
    if (auto r = cache->clear_results(e.path); !r) {
      fmt::print(stderr, "neffcache: left {} alone: {}\n", e.path, r.error().message);
      ++left;
      continue;
    }
    ++cleared;
  }
  fmt::print("{} entries are pending again, {} left alone\n", cleared, left);
  return k_exit_ok;
}

}  // namespace neffcache::cli
