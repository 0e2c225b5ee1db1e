// neffcache index [--rebuild]: records in the content index the done and failed entries
// it does not know yet; --rebuild forgets the whole index first and records every entry
// anew (after the index was damaged, or to drop what it still says of removed entries).
#include "neffcache/cmd_index.hpp"

#include <fmt/format.h>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_index(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(
      app, exit_code, "index",
      "Record in the content index the done and failed entries it does not know yet (written by clients or "
      "other tools), so that a graph compiled under one name is found under any other",
      run_index);
  sub->add_flag("--rebuild", opts->rebuild, "forget the whole index first, then record every entry anew");
}

int run_index(const IndexOptions& opts) {
  auto cache = open_cache(opts.cache, Access::change);
  if (!cache) return report(cache.error());
  auto flags = compiler_flags({});
  if (!flags) return report(flags.error());
  auto update = (*cache)->update_index(opts.rebuild, flags->compiler_flags);
  if (!update) return report(update.error());
  fmt::print("{} done or failed entries, {} recorded now{}{}\n", update->entries, update->added,
             update->unreadable
                 ? fmt::format(", {} without a readable HLO or flags (not indexed)", update->unreadable)
                 : "",
             update->forgotten ? fmt::format(", {} record{} of entries gone forgotten", update->forgotten,
                                             update->forgotten == 1 ? "" : "s")
                               : "");
  return k_exit_ok;
}

}  // namespace neffcache::cli
