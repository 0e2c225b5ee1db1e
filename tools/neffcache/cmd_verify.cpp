// neffcache verify [--repair]: every finished entry's NEFF present and equal to what was
// published (size and xxh3); --repair makes broken entries pending again.
#include "neffcache/cmd_verify.hpp"

#include <memory>

#include <fmt/format.h>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/maintenance.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_verify(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<VerifyOptions>();
  auto* sub = app.add_subcommand(
      "verify", "Check every finished NEFF against the size and checksum recorded when it was published; "
                "exit 1 if any is broken");
  add_cache_option(sub, opts->cache);
  sub->add_flag("--repair", opts->repair, "make broken entries pending again, so they compile anew");
  sub->callback([opts, &exit_code] { exit_code = run_verify(*opts); });
}

int run_verify(const VerifyOptions& opts) {
  auto cache = MaintainedCache::open(opts.cache);
  if (!cache) return report(cache.error());
  auto entries = cache->entries();
  if (!entries) return report(entries.error());
  std::size_t checked = 0, broken = 0, repaired = 0, unrecorded = 0;
  for (const auto& e : *entries) {
    if (!e.files.has(EntryFile::done)) continue;
    ++checked;
    auto v = cache->verify(e);
    if (v.check == NeffCheck::unrecorded) ++unrecorded;
    if (v.check != NeffCheck::broken) continue;
    ++broken;
    fmt::print("broken {}: {}\n", e.path, v.why);
    if (!opts.repair) continue;
    if (auto r = cache->clear_results(e.path); !r) {
      fmt::print(stderr, "neffcache: could not repair {}: {}\n", e.path, r.error().message);
      continue;
    }
    ++repaired;
    fmt::print("repaired {}: pending again\n", e.path);
  }
  fmt::print("{} checked, {} broken, {} repaired, {} without a record (present and not empty)\n", checked, broken,
             repaired, unrecorded);
  if (broken > repaired)
    return report(fmt::format("{} broken entr{}; run with --repair to compile them again", broken - repaired,
                              broken - repaired == 1 ? "y" : "ies"));
  return k_exit_ok;
}

}  // namespace neffcache::cli
