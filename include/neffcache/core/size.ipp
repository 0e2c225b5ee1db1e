// Definitions of core/size.hpp (core/decl.hpp).
#pragma once

#include <neffcache/core/size.hpp>

#include <cctype>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL std::optional<uint64_t> parse_size(std::string_view s) {
  std::size_t used = 0;
  uint64_t n = 0;
  for (; used < s.size() && std::isdigit(static_cast<unsigned char>(s[used])); ++used) {
    uint64_t digit = static_cast<uint64_t>(s[used] - '0');
    if (n > (UINT64_MAX - digit) / 10) return std::nullopt;
    n = n * 10 + digit;
  }
  if (used == 0) return std::nullopt;
  std::string unit;
  for (char c : s.substr(used)) unit += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  int shift = -1;
  if (unit == "" || unit == "B") shift = 0;
  else if (unit == "K" || unit == "KB" || unit == "KIB") shift = 10;
  else if (unit == "M" || unit == "MB" || unit == "MIB") shift = 20;
  else if (unit == "G" || unit == "GB" || unit == "GIB") shift = 30;
  else if (unit == "T" || unit == "TB" || unit == "TIB") shift = 40;
  if (shift < 0 || (shift > 0 && n > (UINT64_MAX >> shift))) return std::nullopt;
  return n << shift;
}

NEFFCACHE_DECL std::string format_size(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  return u == 0 ? fmt::format("{} B", bytes) : fmt::format("{:.1f} {}", v, units[u]);
}

}  // namespace neffcache
