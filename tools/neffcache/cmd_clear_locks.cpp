// neffcache clear-locks: remove the locks whose owner is gone, and only those. Safe while
// other processes use the cache: a live lock is left alone, and the output says why.
#include "neffcache/cmd_clear_locks.hpp"

#include <fmt/format.h>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_clear_locks(CLI::App& app, int& exit_code) {
  add_cache_command(app, exit_code, "clear-locks",
                    "Remove stale entry locks (owner gone); live ones are left alone, with the reason", run_clear_locks);
}

int run_clear_locks(const ClearLocksOptions& opts) {
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

}  // namespace neffcache::cli
