// neffcache clean [--yes]: remove every entry of the cache, except those being compiled.
#include "neffcache/cmd_clean.hpp"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <set>

#include <fmt/format.h>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/maintenance.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_clean(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<CleanOptions>();
  auto* sub = app.add_subcommand(
      "clean", "Remove every cache entry (entries being compiled are left alone); asks first unless --yes");
  add_cache_option(sub, opts->cache);
  sub->add_flag("-y,--yes", opts->yes, "do not ask");
  sub->callback([opts, &exit_code] { exit_code = run_clean(*opts); });
}

int run_clean(const CleanOptions& opts) {
  auto cache = MaintainedCache::open(opts.cache);
  if (!cache) return report(cache.error());
  auto entries = cache->entries();
  if (!entries) return report(entries.error());
  uint64_t bytes = 0;
  for (const auto& e : *entries) bytes += e.bytes;
  if (!opts.yes) {
    if (::isatty(STDIN_FILENO) != 1)
      return report(fmt::format("clean removes {} entries ({} bytes) from {}; give --yes to confirm", entries->size(),
                                bytes, cache->name()));
    fmt::print(stderr, "Remove {} entries ({} bytes) from {}? [y/N] ", entries->size(), bytes, cache->name());
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "y" && answer != "Y" && answer != "yes") return report("nothing removed");
  }
  std::size_t removed = 0, left = 0;
  std::set<std::string> compiler_dirs;
  for (const auto& e : *entries) {
    compiler_dirs.insert(e.path.substr(0, e.path.find('/')));
    if (auto r = cache->remove_entry(e.path); !r) {
      fmt::print(stderr, "neffcache: left {} alone: {}\n", e.path, r.error().message);
      ++left;
      continue;
    }
    ++removed;
  }
  // Compiler folders that are empty now go too; a folder still in use stays.
  cache->remove_empty_compiler_dirs(compiler_dirs);
  fmt::print("{} entries removed ({} bytes), {} left alone\n", removed, bytes, left);
  return k_exit_ok;
}

}  // namespace neffcache::cli
