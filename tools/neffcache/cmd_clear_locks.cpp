// neffcache clear-locks: remove the locks whose owner is gone, and only those. Safe while
// other processes use the cache: a live lock is left alone, and the output says why.
#include "neffcache/cmd_clear_locks.hpp"

#include <memory>

#include <fmt/format.h>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/maintenance.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_clear_locks(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ClearLocksOptions>();
  auto* sub = app.add_subcommand(
      "clear-locks", "Remove stale entry locks (owner gone); live ones are left alone, with the reason");
  add_cache_option(sub, opts->cache);
  sub->callback([opts, &exit_code] { exit_code = run_clear_locks(*opts); });
}

int run_clear_locks(const ClearLocksOptions& opts) {
  auto cache = MaintainedCache::open(opts.cache);
  if (!cache) return report(cache.error());
  auto entries = cache->entries();
  if (!entries) return report(entries.error());
  std::size_t removed = 0, live = 0;
  for (const auto& e : *entries) {
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
