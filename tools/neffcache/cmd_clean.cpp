// neffcache clean [--yes]: remove every entry of the cache, except those being compiled.
#include "neffcache/cmd_clean.hpp"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <memory>
#include <set>

#include <fmt/format.h>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_clean(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(
      app, exit_code, "clean", "Remove every cache entry (entries being compiled are left alone); asks first unless --yes",
      run_clean);
  sub->add_flag("-y,--yes", opts->yes, "do not ask");
}

int run_clean(const CleanOptions& opts) {
  auto listed = open_listed(opts.cache, Access::change);
  if (!listed) return report(listed.error());
  const auto& [cache, entries] = *listed;
  uint64_t bytes = 0;
  for (const auto& e : entries) bytes += e.bytes;
  if (!opts.yes) {
    if (::isatty(STDIN_FILENO) != 1)
      return report(fmt::format("clean removes {} entries ({} bytes) from {}; give --yes to confirm", entries.size(),
                                bytes, cache->name()));
    fmt::print(stderr, "Remove {} entries ({} bytes) from {}? [y/N] ", entries.size(), bytes, cache->name());
    std::string answer;
    std::getline(std::cin, answer);
    if (answer != "y" && answer != "Y" && answer != "yes") return report("nothing removed");
  }
  std::size_t removed = 0, left = 0;
  std::set<std::string> compiler_dirs;
  for (const auto& info : entries) {
    const auto e = cache->entry(info);
    compiler_dirs.insert(e.compiler_dir());
    if (auto r = cache->remove(e); !r) {
      fmt::print(stderr, "neffcache: left {} alone: {}\n", e.path(), r.error().message);
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
