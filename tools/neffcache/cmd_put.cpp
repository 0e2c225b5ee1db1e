// neffcache put HLO_FILE: store a graph as a pending entry, as graph extraction does.
#include "neffcache/cmd_put.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/core/file.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_put(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_command(
      app, exit_code, "put",
      "Store an HLO file as a pending cache entry (the HLO and compile_flags.json) and print its folder", run_put);
  add_graph_inputs(sub, opts->graph);
  add_cache_option(sub, opts->cache);
  sub->add_flag("--json", opts->json, "print a JSON object");
}

int run_put(const PutOptions& opts) {
  auto cache = open_cache(opts.cache, Access::change);
  if (!cache) return report(cache.error());
  auto graph = read_graph(opts.graph);
  if (!graph) return report(graph.error());
  // The key first: a file that is no HLO is refused before anything is created.
  auto key = entry_key(graph->bytes, graph->flags.compiler_flags, graph->compiler_version);
  if (!key) return report(fmt::format("{}: {}", opts.graph.hlo_file, key.error().message));

  auto entry = (*cache)->at(key->relative_path());
  if (!entry) return report(entry.error());
  auto created = (*cache)->put_graph(*entry, graph->bytes, graph->flags.compiler_flags);
  if (!created) return report(created.error());
  if (opts.json) {
    nlohmann::ordered_json j{{"path", entry->view()}, {"key", key->relative_path()}, {"created", *created}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}\n", entry->view());
  }
  return k_exit_ok;
}

}  // namespace neffcache::cli
