// neffcache retry [ENTRY... | --all]: forget recorded failures so those entries compile again.
#include "neffcache/cmd_retry.hpp"

#include <fmt/format.h>

#include "neffcache/common.hpp"

namespace neffcache::cli {

namespace {

void check_retry(const RetryOptions& opts) {
  if (opts.entries.empty() == !opts.all) throw CLI::ValidationError("retry", "name entries or give --all (not both)");
}

}  // namespace

void setup_retry(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_command(app, exit_code, "retry",
                                 "Clear recorded failures (model.log; LNL: ours, in the cache's .neffcache/lnl/) "
                                 "so those entries compile again",
                                 run_retry,
                                 check_retry);
  sub->add_option("ENTRY", opts->entries, "entry folders (MODULE_*, or an LNL entry's 32-hex key folder), or files in them; paths or relative to "
                  "the cache");
  sub->add_flag("--all", opts->all, "every failed entry");
  add_cache_option(sub, opts->cache);
}

int run_retry(const RetryOptions& opts) {
  auto cache = open_cache(opts.cache, Access::change);
  if (!cache) return report(cache.error());
  std::vector<store::Entry> targets;
  if (opts.all) {
    auto entries = (*cache)->list();
    if (!entries) return report(entries.error());
    for (const auto& e : *entries)
      if (e.state == EntryState::failed) targets.push_back((*cache)->entry(e));
  } else {
    for (const auto& arg : opts.entries) {
      auto e = (*cache)->named(arg);
      if (!e) return report(e.error());
      targets.push_back(*e);
    }
  }
  std::size_t cleared = 0;
  for (const auto& t : targets) {
    auto r = (*cache)->clear_failure(t);
    if (!r) {
      fmt::print(stderr, "neffcache: left {} alone: {}\n", t.view(), r.error().message);
      continue;
    }
    if (*r) {
      fmt::print("{}\n", t.view());
      ++cleared;
    } else {
      fmt::print(stderr, "neffcache: {} has no recorded failure\n", t.view());
    }
  }
  fmt::print(stderr, "neffcache: {} entr{} will compile again\n", cleared, cleared == 1 ? "y" : "ies");
  return k_exit_ok;
}

}  // namespace neffcache::cli
