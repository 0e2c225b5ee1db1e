// neffcache retry [ENTRY... | --all]: forget recorded failures so those entries compile again.
#include "neffcache/cmd_retry.hpp"

#include <memory>

#include <fmt/format.h>
#include <neffcache/inventory.hpp>
#include <neffcache/maintenance.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_retry(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<RetryOptions>();
  auto* sub = app.add_subcommand("retry", "Clear recorded failures (model.log) so those entries compile again");
  sub->add_option("ENTRY", opts->entries, "entry folders (MODULE_*), or files in them; paths or relative to the cache");
  sub->add_flag("--all", opts->all, "every failed entry");
  add_cache_option(sub, opts->cache);
  sub->callback([opts, &exit_code] {
    if (opts->entries.empty() == !opts->all) throw CLI::ValidationError("retry", "name entries or give --all (not both)");
    exit_code = run_retry(*opts);
  });
}

int run_retry(const RetryOptions& opts) {
  auto dirs = CacheDirs::resolve(opts.cache);
  if (!dirs) return report(dirs.error());
  std::vector<EntryPaths> targets;
  if (opts.all) {
    auto entries = list_entries(dirs->backing);
    if (!entries) return report(entries.error());
    for (const auto& e : *entries)
      if (e.state == EntryState::failed) targets.push_back(dirs->entry(e.path));
  } else {
    for (const auto& arg : opts.entries) {
      auto e = named_entry(*dirs, arg);
      if (!e) return report(e.error());
      targets.push_back(*e);
    }
  }
  std::size_t cleared = 0;
  for (const auto& t : targets) {
    auto r = clear_failure(t);
    if (!r) {
      fmt::print(stderr, "neffcache: left {} alone: {}\n", t.view, r.error().message);
      continue;
    }
    if (*r) {
      fmt::print("{}\n", t.view);
      ++cleared;
    } else {
      fmt::print(stderr, "neffcache: {} has no recorded failure\n", t.view);
    }
  }
  fmt::print(stderr, "neffcache: {} entr{} will compile again\n", cleared, cleared == 1 ? "y" : "ies");
  return k_exit_ok;
}

}  // namespace neffcache::cli
