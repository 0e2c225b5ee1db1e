// neffcache put HLO_FILE: store a graph as a pending entry, as graph extraction does.
#include "neffcache/cmd_put.hpp"

#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/core/file.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_put(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<PutOptions>();
  auto* sub = app.add_subcommand(
      "put", "Store an HLO file as a pending cache entry (the HLO and compile_flags.json) and print its folder");
  add_graph_inputs(sub, opts->graph);
  add_cache_option(sub, opts->cache);
  sub->add_flag("--json", opts->json, "print a JSON object");
  sub->callback([opts, &exit_code] { exit_code = run_put(*opts); });
}

int run_put(const PutOptions& opts) {
  auto s3 = s3_target(opts.cache);
  if (!s3) return report(s3.error());
  Result<std::string> root = std::string();
  if (!*s3) {
    root = cache_root(opts.cache);
    if (!root) return report(root.error());
  }
  auto flags = compiler_flags(opts.graph.flags);
  if (!flags) return report(flags.error());
  auto version = compiler_version(opts.graph.compiler_version, opts.graph.compiler);
  if (!version) return report(version.error());
  auto bytes = read_file(opts.graph.hlo_file);
  if (!bytes) return report(bytes.error());
  // The key first: a file that is no HLO is refused before anything is created.
  auto key = entry_key(*bytes, flags->compiler_flags, *version);
  if (!key) return report(fmt::format("{}: {}", opts.graph.hlo_file, key.error().message));

  Result<std::string> entry = std::string();
  Result<bool> created = false;
  if (*s3) {
    entry = (*s3)->entry_url(key->relative_path());
    created = store_s3_graph(*(*s3)->s3, (*s3)->url.prefix, key->relative_path(), *bytes, flags->compiler_flags);
  } else {
    entry = make_entry_folder(*root, *key);
    if (!entry) return report(entry.error());
    created = store_graph(*entry, *bytes, flags->compiler_flags);
  }
  if (!created) return report(created.error());
  if (opts.json) {
    nlohmann::ordered_json j{{"path", *entry}, {"key", key->relative_path()}, {"created", *created}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}\n", *entry);
  }
  return k_exit_ok;
}

}  // namespace neffcache::cli
