// neffcache put HLO_FILE: store a graph as a pending entry, as graph extraction does.
#include "neffcache/cmd_put.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/key.hpp>
#include <neffcache/layout.hpp>

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
  auto root = cache_root(opts.cache);
  if (!root) return report(root.error());
  auto flags = compiler_flags(opts.graph.flags);
  if (!flags) return report(flags.error());
  auto version = compiler_version(opts.graph.compiler_version, opts.graph.compiler);
  if (!version) return report(version.error());
  auto bytes = detail::read_file(opts.graph.hlo_file);
  if (!bytes) return report(bytes.error());
  // The key first: a file that is no HLO is refused before anything is created.
  auto key = entry_key(*bytes, flags->compiler_flags, *version);
  if (!key) return report(fmt::format("{}: {}", opts.graph.hlo_file, key.error().message));

  const std::string entry = fmt::format("{}/{}", *root, key->relative_path());
  for (const auto& dir : {*root, fmt::format("{}/{}", *root, key->compiler_dir()), entry})
    if (::mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) return report(sys_error("create", dir));
  auto files = read_entry_files(entry);
  if (!files) return report(files.error());
  // An entry that already has its HLO has this very graph (the key says so): keep it,
  // whatever state it is in.
  bool created = !files->has_hlo();
  if (created) {
    // compile_flags.json before the HLO: whoever sees the HLO sees a complete job.
    auto f = write_compile_flags(fmt::format("{}/{}", entry, k_compile_flags_file), flags->compiler_flags);
    if (!f) return report(f.error());
    auto h = detail::write_file_atomic(fmt::format("{}/{}", entry, k_hlo_module_file), *bytes);
    if (!h) return report(h.error());
  }
  if (opts.json) {
    nlohmann::ordered_json j{{"path", entry}, {"key", key->relative_path()}, {"created", created}};
    fmt::print("{}\n", j.dump(2));
  } else {
    fmt::print("{}\n", entry);
  }
  return k_exit_ok;
}

}  // namespace neffcache::cli
