// neffcache clear-neffs: remove compiled results (NEFFs and failure logs) and keep the
// graphs, so every entry is pending again.
#include "neffcache/cmd_clear_neffs.hpp"

#include <fmt/format.h>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_clear_neffs(CLI::App& app, int& exit_code) {
  add_cache_command(app, exit_code, "clear-neffs",
                    "Remove compiled NEFFs and failure logs, keeping the graphs: every entry is pending again",
                    run_clear_neffs);
}

int run_clear_neffs(const ClearNeffsOptions& opts) {
  auto listed = open_listed(opts.cache, Access::change);
  if (!listed) return report(listed.error());
  const auto& [cache, entries] = *listed;
  std::size_t cleared = 0, left = 0;
  for (const auto& e : entries) {
    if (e.state != EntryState::done && e.state != EntryState::failed) continue;
    if (auto r = cache->clear_results(cache->entry(e)); !r) {
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
