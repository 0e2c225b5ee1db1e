// Definitions of cache/record.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/record.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache::detail {

NEFFCACHE_DECL nlohmann::json read_entry_meta(const std::string& entry_dir, struct stat* st, bool legacy) {
  auto read = [&](const std::string& path) -> nlohmann::json {
    struct stat got {};
    if (::lstat(path.c_str(), &got) != 0 || !S_ISREG(got.st_mode)) return nullptr;
    auto text = read_file(path);
    if (!text) return nullptr;
    auto j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return nullptr;
    if (st) *st = got;
    return j;
  };
  if (st) *st = {};
  auto j = read(own_files(entry_dir).record);
  // (An LNL entry of an earlier version: its record inside the folder.)
  if (j.is_null() && legacy && EntryFiles::of_entry_path(entry_dir).is_lnl())
    j = read(fmt::format("{}/{}", entry_dir, k_meta_file));
  return j.is_object() ? j : nlohmann::json::object();
}

NEFFCACHE_DECL bool record_describes(const nlohmann::json& meta, const struct stat& meta_st, const struct stat& neff) {
  if (!meta.contains("size") || meta["size"] != neff.st_size) return false;
  if (meta.contains("mtime_ns")) return meta["mtime_ns"] == mtime_ns(neff);
  return mtime_ns(meta_st) >= mtime_ns(neff);
}

NEFFCACHE_DECL void describe_neff(nlohmann::ordered_json& meta, const struct stat& neff) {
  meta["size"] = neff.st_size;
  meta["ino"] = static_cast<uint64_t>(neff.st_ino);
  meta["mtime_ns"] = mtime_ns(neff);
}

}  // namespace neffcache::detail
