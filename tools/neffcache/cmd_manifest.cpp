// neffcache manifest [--cache MOUNT] [-o FILE]: the entries whose NEFF the clients of a
// neffcachefs mount opened since its daemon started (its stats.json), largest first, as a
// manifest (manifest.hpp) for `neffcache warm` on a fresh host.
#include "neffcache/cmd_manifest.hpp"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/size.hpp>

#include "neffcache/common.hpp"
#include "neffcache/manifest.hpp"

namespace neffcache::cli {

void setup_manifest(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(
      app, exit_code, "manifest",
      "List the entries whose NEFF the clients of a neffcachefs mount opened since it was mounted, as a manifest "
      "for `neffcache warm` on another host",
      run_manifest);
  sub->add_option("-o,--output", opts->output, "write the manifest to this file (whole or not at all); default: stdout");
}

int run_manifest(const ManifestOptions& opts) {
  auto listed = open_listed(opts.cache);
  if (!listed) return report(listed.error());
  const auto& [cache, entries] = *listed;
  auto stats = cache->daemon_stats();
  if (!stats)
    return report(fmt::format("{}: not a neffcachefs mount (a manifest lists what the clients of a mount opened)",
                              cache->name()));
  auto j = nlohmann::json::parse(*stats, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("opened") || !j["opened"].is_array())
    return report(fmt::format("{}: its daemon lists no opened entries (a neffcachefs older than this tool)",
                              cache->name()));
  std::map<std::string, uint64_t, std::less<>> sizes;
  for (const auto& e : entries) sizes[e.path] = e.neff_bytes;
  Manifest m;
  if (j.contains("s3") && j["s3"].is_object() && j["s3"].contains("url") && j["s3"]["url"].is_string())
    m.bucket = j["s3"]["url"].get<std::string>();
  for (const auto& e : j["opened"]) {
    if (!e.is_string()) continue;
    auto size = sizes.find(e.get<std::string>());
    m.entries.push_back({e.get<std::string>(), size == sizes.end() ? 0 : size->second});
  }
  std::sort(m.entries.begin(), m.entries.end(), [](const auto& a, const auto& b) {
    return a.neff_bytes != b.neff_bytes ? a.neff_bytes > b.neff_bytes : a.entry < b.entry;
  });
  uint64_t total = 0;
  for (const auto& e : m.entries) total += e.neff_bytes;
  if (opts.output.empty()) {
    fmt::print("{}", m.text());
  } else {
    if (auto w = detail::write_file_atomic(opts.output, m.text()); !w) return report(w.error());
    fmt::print(stderr, "{}: {} entries, {} of NEFFs\n", opts.output, m.entries.size(), format_size(total));
  }
  return k_exit_ok;
}

}  // namespace neffcache::cli
