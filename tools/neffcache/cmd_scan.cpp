// neffcache scan [--with-failed]: the counts the Neuron tool prints before compiling.
#include "neffcache/cmd_scan.hpp"

#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/inventory.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_scan(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<ScanOptions>();
  auto* sub = app.add_subcommand(
      "scan", "Count the entries a compile run would take on (remaining), and those locked, failed and done");
  add_cache_option(sub, opts->cache);
  sub->add_flag("--with-failed", opts->with_failed, "count failed entries as remaining (they would be retried)");
  sub->add_flag("--json", opts->json, "print a JSON object with the counts by state too");
  sub->callback([opts, &exit_code] { exit_code = run_scan(*opts); });
}

int run_scan(const ScanOptions& opts) {
  auto s3 = s3_target(opts.cache);
  if (!s3) return report(s3.error());
  Result<std::string> root = std::string();
  Result<StateCounts> c = StateCounts{};
  if (*s3) {
    root = (*s3)->url.text;
    auto entries = list_s3_entries(*(*s3)->s3, (*s3)->url.prefix);
    if (!entries) return report(entries.error());
    for (const auto& e : *entries) ++c->of(e.state);
  } else {
    root = cache_root(opts.cache);
    if (!root) return report(root.error());
    c = count_entries(entries_root(*root));
  }
  if (!c) return report(c.error());
  const std::size_t remaining = c->remaining(opts.with_failed);
  const std::size_t failed = opts.with_failed ? 0 : c->failed;
  const std::size_t total = remaining + c->compiling + failed + c->done;
  if (opts.json) {
    nlohmann::ordered_json j{{"cache", *root},
                             {"remaining", remaining},
                             {"locked", c->compiling},
                             {"failed", failed},
                             {"done", c->done},
                             {"total", total},
                             {"states",
                              {{"empty", c->empty},
                               {"pending", c->pending},
                               {"compiling", c->compiling},
                               {"done", c->done},
                               {"failed", c->failed},
                               {"stale", c->stale}}}};
    fmt::print("{}\n", j.dump(2));
    return k_exit_ok;
  }
  fmt::print("INFO ||NEURON_CACHE||: Compile cache path: {}\n", *root);
  fmt::print("INFO ||NEURON_CACHE||: Current remaining items are {}, locked are {}, failed are {}, done are {}, total is {}\n",
             remaining, c->compiling, failed, c->done, total);
  return k_exit_ok;
}

}  // namespace neffcache::cli
