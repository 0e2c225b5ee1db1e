// neffcache clear-locks: remove the locks whose owner is gone, and only those. Safe while
// other processes use the cache: a live lock is left alone, and the output says why.
// neffcache clear-neffs: remove compiled results (NEFFs and failure logs) and keep the
// graphs, so every entry is pending again.
#include "neffcache/cmd_clear.hpp"

#include <fmt/format.h>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_clear_locks(CLI::App& app, int& exit_code) {
  add_cache_command(app, exit_code, "clear-locks",
                    "Remove stale entry locks (owner gone); live ones are left alone, with the reason", run_clear_locks);
}

int run_clear_locks(const ClearOptions& opts) {
  auto listed = open_listed(opts.cache, Access::change);
  if (!listed) return report(listed.error());
  const auto& [cache, entries] = *listed;
  std::size_t removed = 0, live = 0;
  for (const auto& e : entries) {
    if (!e.files.has_lock()) continue;
    auto r = cache->clear_stale_lock(e);
    if (r) {
      fmt::print("removed the stale lock of {}: {}\n", e.path, *r);
      ++removed;
    } else if (r.error().code == Errc::busy) {
      fmt::print("left {} alone: {}\n", e.path, r.error().message);
      ++live;
    } else if (r.error().code != Errc::not_found) {  // not_found: released meanwhile
      return report(r.error());
    }
  }
  fmt::print("{} stale lock{} removed, {} live lock{} left alone\n", removed, removed == 1 ? "" : "s", live,
             live == 1 ? "" : "s");
  return k_exit_ok;
}


void setup_clear_neffs(CLI::App& app, int& exit_code) {
  add_cache_command(app, exit_code, "clear-neffs",
                    "Remove compiled NEFFs and failure logs, keeping the graphs: every entry is pending again",
                    run_clear_neffs);
}

int run_clear_neffs(const ClearOptions& opts) {
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
