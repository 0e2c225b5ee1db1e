// neffcache verify [--repair]: every finished entry's NEFF present and equal to what was
// published (size and xxh3); --repair makes broken entries pending again.
#include "neffcache/cmd_verify.hpp"

#include <fmt/format.h>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_verify(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(app, exit_code, "verify",
                                       "Check every finished NEFF against the size and checksum recorded when it "
                                       "was published; exit 1 if any is broken",
                                       run_verify);
  sub->add_flag("--repair", opts->repair, "make broken entries pending again, so they compile anew");
}

int run_verify(const VerifyOptions& opts) {
  auto listed = open_listed(opts.cache);
  if (!listed) return report(listed.error());
  const auto& [cache, entries] = *listed;
  std::size_t checked = 0, broken = 0, repaired = 0, unrecorded = 0;
  for (const auto& e : entries) {
    if (!e.files.has(EntryFile::done)) continue;
    ++checked;
    auto v = cache->verify(e);
    if (v.check == NeffCheck::unrecorded) ++unrecorded;
    if (v.check != NeffCheck::broken) continue;
    ++broken;
    fmt::print("broken {}: {}\n", e.path, v.why);
    if (!opts.repair) continue;
    if (auto r = cache->clear_results(cache->entry(e)); !r) {
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
