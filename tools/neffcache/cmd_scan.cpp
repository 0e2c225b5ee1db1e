// neffcache scan [--with-failed]: the counts the Neuron tool prints before compiling.
// LNL entries count whatever the compiler: they have no compiler folder (their key covers
// the compiler's version, which cannot be read back), and a compile run takes them all.
#include "neffcache/cmd_scan.hpp"

#include <set>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/key.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

namespace {

// The compiler folders a scan counts, and why those.
struct CompilerScope {
  std::set<std::string> dirs;
  std::string why;
};

// The folder of `compiler`'s version when it answers `--version` and the cache has that
// folder; else every compiler folder of `entries`. Needs no compiler.
CompilerScope compiler_scope(const store::Store& cache, const std::vector<EntryInfo>& entries,
                             const std::string& compiler) {
  std::set<std::string> all;
  for (const auto& e : entries)
    if (auto dir = cache.entry(e).compiler_dir(); !dir.empty()) all.insert(std::move(dir));
  auto version = detect_compiler_version(compiler);
  if (version) {
    std::string dir = compiler_dir_name(*version);
    if (all.contains(dir)) return {{dir}, fmt::format("the folder of '{}' {}", compiler, *version)};
    return {all, fmt::format("every compiler folder; none is of '{}' {}", compiler, *version)};
  }
  return {all, fmt::format("every compiler folder; {}", version.error().message)};
}

}  // namespace

void setup_scan(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(
      app, exit_code, "scan",
      "Count the entries a compile run would take on (remaining), and those locked, failed and done", run_scan);
  sub->add_flag("--with-failed", opts->with_failed, "count failed entries as remaining (they would be retried)");
  sub->add_flag("--json", opts->json, "print a JSON object with the counts by state too");
  sub->add_option("--compiler", opts->compiler,
                  "count only the folder of this compiler's version when it is installed and the cache has one "
                  "(else every compiler folder)")
      ->capture_default_str();
}

int run_scan(const ScanOptions& opts) {
  auto listed = open_listed(opts.cache);
  if (!listed) return report(listed.error());
  const auto& [cache, entries] = *listed;
  const std::string root = cache->name();
  const auto scope = compiler_scope(*cache, entries, opts.compiler);
  StateCounts c;
  std::size_t lnl = 0;
  for (const auto& e : entries) {
    if (e.files.is_lnl()) ++lnl;
    if (e.files.is_lnl() || scope.dirs.contains(cache->entry(e).compiler_dir())) ++c.of(e.state);
  }
  const std::size_t remaining = c.remaining(opts.with_failed);
  const std::size_t failed = opts.with_failed ? 0 : c.failed;
  const std::size_t total = remaining + c.compiling + failed + c.done;
  if (opts.json) {
    nlohmann::ordered_json j{{"cache", root},
                             {"compiler_dirs", scope.dirs},
                             {"lnl_entries", lnl},
                             {"remaining", remaining},
                             {"locked", c.compiling},
                             {"failed", failed},
                             {"done", c.done},
                             {"total", total},
                             {"states",
                              {{"empty", c.empty},
                               {"pending", c.pending},
                               {"partial", c.partial},
                               {"compiling", c.compiling},
                               {"done", c.done},
                               {"failed", c.failed},
                               {"stale", c.stale}}}};
    fmt::print("{}\n", j.dump(2));
    return k_exit_ok;
  }
  fmt::print("INFO ||NEURON_CACHE||: Compile cache path: {}\n", root);
  fmt::print("INFO ||NEURON_CACHE||: Counting {} ({}){}\n",
             scope.dirs.empty() ? std::string("no compiler folder") : fmt::format("{}", fmt::join(scope.dirs, ", ")),
             scope.why, lnl ? fmt::format(", and {} LNL entr{}", lnl, lnl == 1 ? "y" : "ies") : "");
  // Remaining counts them; said apart, since the Neuron tool has no such state.
  if (c.partial)
    fmt::print("INFO ||NEURON_CACHE||: Of the remaining items {} are partial (a NEFF or marker without the rest, "
               "compiled again)\n",
               c.partial);
  fmt::print("INFO ||NEURON_CACHE||: Current remaining items are {}, locked are {}, failed are {}, done are {}, total is {}\n",
             remaining, c.compiling, failed, c.done, total);
  return k_exit_ok;
}

}  // namespace neffcache::cli
