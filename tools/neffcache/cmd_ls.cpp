// neffcache ls [--state S] [--json]: the entries of a cache with state, size, compile
// time and last use. An LNL entry's path is its key; the JSON says each entry's dialect.
#include "neffcache/cmd_ls.hpp"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/cache/inventory.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_ls(CLI::App& app, int& exit_code) {
  auto [sub, opts] =
      add_cache_command(app, exit_code, "ls", "List cache entries with state, size, compile time and last use", run_ls);
  sub->add_option("--state", opts->state, "only entries in this state")
      ->check(CLI::IsMember({"empty", "pending", "partial", "compiling", "done", "failed", "stale"}));
  sub->add_flag("--json", opts->json, "print a JSON list");
}

int run_ls(const LsOptions& opts) {
  auto listed = open_listed(opts.cache);
  if (!listed) return report(listed.error());
  auto* entries = &listed->entries;
  auto wanted = parse_entry_state(opts.state);
  std::erase_if(*entries, [&](const EntryInfo& e) { return wanted && e.state != *wanted; });
  std::sort(entries->begin(), entries->end(), [](const auto& a, const auto& b) { return a.path < b.path; });

  if (opts.json) {
    auto list = nlohmann::ordered_json::array();
    for (const auto& e : *entries) {
      nlohmann::ordered_json j{{"path", e.path},
                               {"dialect", to_string(e.files.dialect)},
                               {"state", to_string(e.state)},
                               {"bytes", e.bytes},
                               {"neff_bytes", e.neff_bytes},
                               {"compile_seconds", nullptr},
                               {"last_use", utc_time(e.last_use)}};
      if (e.compile_seconds) j["compile_seconds"] = *e.compile_seconds;
      if (e.copied_from) j["copied_from"] = *e.copied_from;
      if (e.peak_kib) j["peak_kib"] = e.peak_kib;
      if (e.predicted_peak_kib) j["predicted_peak_kib"] = e.predicted_peak_kib;
      if (e.oom_retries) j["oom_retries"] = e.oom_retries;
      if (e.layer) j["layer"] = e.layer;  // over layers: a read-only one (1 is the first under the top)
      list.push_back(std::move(j));
    }
    fmt::print("{}\n", list.dump(2));
    return k_exit_ok;
  }
  // PEAK: the compile's peak memory / the reservation it was admitted with (its prediction).
  auto mib = [](uint64_t kib) { return kib ? fmt::format("{}M", (kib + 1023) / 1024) : std::string("-"); };
  fmt::print("{:<9} {:>10} {:>9} {:>13} {:<20} {}\n", "STATE", "BYTES", "COMPILE", "PEAK/PRED", "LAST USE", "ENTRY");
  for (const auto& e : *entries)
    fmt::print("{:<9} {:>10} {:>9} {:>13} {:<20} {}{}{}{}\n", to_string(e.state), e.bytes,
               e.compile_seconds ? fmt::format("{:.1f}s", *e.compile_seconds) : "-",
               e.peak_kib ? fmt::format("{}/{}", mib(e.peak_kib), mib(e.predicted_peak_kib)) : "-",
               utc_time(e.last_use), e.path, e.copied_from ? fmt::format(" (copy of {})", *e.copied_from) : "",
               e.oom_retries ? fmt::format(" ({} out-of-memory kill{} first)", e.oom_retries,
                                           e.oom_retries == 1 ? "" : "s")
                             : "",
               e.layer ? fmt::format(" (read-only layer {})", e.layer) : "");
  return k_exit_ok;
}

}  // namespace neffcache::cli
