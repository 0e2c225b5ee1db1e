// neffcache retry [ENTRY... | --all]: forget recorded failures so those entries compile again.
#include "neffcache/cmd_retry.hpp"

#include <memory>

#include <fmt/format.h>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/maintenance.hpp>

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
  auto cache = MaintainedCache::open(opts.cache);
  if (!cache) return report(cache.error());
  std::vector<std::string> targets;
  if (opts.all) {
    auto entries = cache->entries();
    if (!entries) return report(entries.error());
    for (const auto& e : *entries)
      if (e.state == EntryState::failed) targets.push_back(e.path);
  } else {
    for (const auto& arg : opts.entries) {
      auto rel = cache->named(arg);
      if (!rel) return report(rel.error());
      targets.push_back(*rel);
    }
  }
  std::size_t cleared = 0;
  for (const auto& t : targets) {
    auto r = cache->clear_failure(t);
    if (!r) {
      fmt::print(stderr, "neffcache: left {} alone: {}\n", cache->view_of(t), r.error().message);
      continue;
    }
    if (*r) {
      fmt::print("{}\n", cache->view_of(t));
      ++cleared;
    } else {
      fmt::print(stderr, "neffcache: {} has no recorded failure\n", cache->view_of(t));
    }
  }
  fmt::print(stderr, "neffcache: {} entr{} will compile again\n", cleared, cleared == 1 ? "y" : "ies");
  return k_exit_ok;
}

}  // namespace neffcache::cli
