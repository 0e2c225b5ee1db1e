// neffcache ls [--state S] [--json]: the entries of a cache with state, size, compile
// time and last use.
#include "neffcache/cmd_ls.hpp"

#include <algorithm>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/cache/inventory.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_ls(CLI::App& app, int& exit_code) {
  auto opts = std::make_shared<LsOptions>();
  auto* sub = app.add_subcommand("ls", "List cache entries with state, size, compile time and last use");
  add_cache_option(sub, opts->cache);
  sub->add_option("--state", opts->state, "only entries in this state")
      ->check(CLI::IsMember({"empty", "pending", "compiling", "done", "failed", "stale"}));
  sub->add_flag("--json", opts->json, "print a JSON list");
  sub->callback([opts, &exit_code] { exit_code = run_ls(*opts); });
}

int run_ls(const LsOptions& opts) {
  auto s3 = s3_target(opts.cache);
  if (!s3) return report(s3.error());
  Result<std::vector<EntryInfo>> entries = std::vector<EntryInfo>{};
  if (*s3) {
    entries = list_s3_entries(*(*s3)->s3, (*s3)->url.prefix);
  } else {
    auto root = cache_root(opts.cache);
    if (!root) return report(root.error());
    entries = list_entries(entries_root(*root));
  }
  if (!entries) return report(entries.error());
  auto wanted = parse_entry_state(opts.state);
  std::erase_if(*entries, [&](const EntryInfo& e) { return wanted && e.state != *wanted; });
  std::sort(entries->begin(), entries->end(), [](const auto& a, const auto& b) { return a.path < b.path; });

  if (opts.json) {
    auto list = nlohmann::ordered_json::array();
    for (const auto& e : *entries) {
      nlohmann::ordered_json j{{"path", e.path},
                               {"state", to_string(e.state)},
                               {"bytes", e.bytes},
                               {"neff_bytes", e.neff_bytes},
                               {"compile_seconds", nullptr},
                               {"last_use", utc_time(e.last_use)}};
      if (e.compile_seconds) j["compile_seconds"] = *e.compile_seconds;
      list.push_back(std::move(j));
    }
    fmt::print("{}\n", list.dump(2));
    return k_exit_ok;
  }
  fmt::print("{:<9} {:>10} {:>9} {:<20} {}\n", "STATE", "BYTES", "COMPILE", "LAST USE", "ENTRY");
  for (const auto& e : *entries)
    fmt::print("{:<9} {:>10} {:>9} {:<20} {}\n", to_string(e.state), e.bytes,
               e.compile_seconds ? fmt::format("{:.1f}s", *e.compile_seconds) : "-", utc_time(e.last_use), e.path);
  return k_exit_ok;
}

}  // namespace neffcache::cli
