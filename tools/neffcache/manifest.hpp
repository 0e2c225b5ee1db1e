// A warm-start manifest: the entries a run opened, for `neffcache warm` to fetch into a
// fresh host's tier before its model starts. One JSON object, written by `neffcache
// manifest`:
//   {"manifest": 1, "bucket": "s3://...", "entries": [{"entry": PATH, "neff_bytes": N}, ...]}
// `bucket` is the cache the mount served (empty for a directory cache); entries are
// paths in the cache (neuronxcc-*/MODULE_*, LNL keys), largest NEFF first.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/layout.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache::cli {

struct Manifest {
  struct Item {
    std::string entry;
    uint64_t neff_bytes = 0;
  };
  std::string bucket;
  std::vector<Item> entries;

  std::string text() const {
    nlohmann::ordered_json j{{"manifest", 1}, {"bucket", bucket}, {"entries", nlohmann::ordered_json::array()}};
    for (const auto& e : entries) j["entries"].push_back({{"entry", e.entry}, {"neff_bytes", e.neff_bytes}});
    return j.dump(2) + "\n";
  }

  // Reads a manifest's text; `what` names it in errors. Entries that are no entry paths
  // are an error: a manifest is never half used.
  static Result<Manifest> parse(const std::string& text, const std::string& what) {
    auto j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    auto bad = [&](std::string_view why) { return Error{Errc::invalid_argument, fmt::format("{}: {}", what, why)}; };
    if (!j.is_object() || !j.contains("manifest") || j["manifest"] != 1 || !j.contains("entries") ||
        !j["entries"].is_array())
      return bad("not a neffcache manifest (version 1)");
    Manifest m;
    if (j.contains("bucket") && j["bucket"].is_string()) m.bucket = j["bucket"].get<std::string>();
    for (const auto& e : j["entries"]) {
      if (!e.is_object() || !e.contains("entry") || !e["entry"].is_string() ||
          !is_entry_path(e["entry"].get<std::string>()))
        return bad(fmt::format("not an entry path: {}", e.dump()));
      Item item{e["entry"].get<std::string>(), 0};
      if (e.contains("neff_bytes") && e["neff_bytes"].is_number_unsigned()) item.neff_bytes = e["neff_bytes"];
      m.entries.push_back(std::move(item));
    }
    return m;
  }
};

}  // namespace neffcache::cli
