// neffcache key HLO_FILE: the entry path of a graph, relative to the cache root.
#include "neffcache/cmd_key.hpp"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/core/file.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/location.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_key(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_command(
      app, exit_code, "key", "Print the cache entry of an HLO file, e.g. neuronxcc-2.21.0/MODULE_<20 hex>+<8 hex>", run_key);
  add_graph_inputs(sub, opts->graph);
  sub->add_option("--explain", opts->explain_file,
                  "write the exact canonical text that was hashed to this file (diff two of "
                  "them to see why keys differ)");
  sub->add_flag("--legacy", opts->legacy, "use the legacy space-joined flags hash");
  sub->add_flag("--json", opts->json, "print a JSON object instead of the path");
}

int run_key(const KeyOptions& opts) {
  auto graph = read_graph(opts.graph);
  if (!graph) return report(graph.error());
  const auto& flags = graph->flags;
  std::string canonical;
  CanonicalSink dump;
  if (!opts.explain_file.empty()) dump = [&](std::string_view piece) { canonical += piece; };
  auto key = entry_key(graph->bytes, flags.compiler_flags, graph->compiler_version,
                       opts.legacy ? FlagsHashForm::legacy : FlagsHashForm::json, dump);
  if (!key) return report(fmt::format("{}: {}", opts.graph.hlo_file, key.error().message));
  if (!opts.explain_file.empty()) {
    if (auto w = write_file_atomic(opts.explain_file, canonical); !w) return report(w.error());
  }

  if (opts.json) {
    nlohmann::json j{{"path", key->relative_path()},
                     {"compiler_version", key->compiler_version},
                     {"graph_hash", key->graph_hash},
                     {"flags_hash", key->flags_hash},
                     {"flags", flags.compiler_flags}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}\n", key->relative_path());
  }
  return k_exit_ok;
}

}  // namespace neffcache::cli
