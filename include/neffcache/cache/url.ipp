// Definitions of cache/url.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/url.hpp>

#include <algorithm>

#include <fmt/format.h>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::optional<std::string> bucket_problem(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return "must have 3 to 63 characters";
  for (char c : b)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-'))
      return fmt::format("has the character '{}' (allowed: a-z 0-9 . -)", c);
  auto edge_ok = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!edge_ok(b.front()) || !edge_ok(b.back())) return "must start and end with a letter or digit";
  if (b.find("..") != std::string_view::npos) return "must not contain \"..\"";
  return std::nullopt;
}

}  // namespace detail

NEFFCACHE_DECL Result<CacheUrl> parse_cache_url(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return Error{Errc::invalid_argument, fmt::format("bad cache URL '{}': {}", url, why)};
  };
  CacheUrl out;
  out.text = std::string(url);
  if (url.empty()) return bad("empty");
  auto scheme_end = url.find("://");
  if (scheme_end == std::string_view::npos) {
    out.path = std::string(url);
    return out;
  }
  std::string_view scheme = url.substr(0, scheme_end);
  std::string_view rest = url.substr(scheme_end + 3);
  if (scheme == "file") {
    if (rest.empty() || rest.front() != '/') return bad("a file:// URL needs an absolute path");
    out.path = std::string(rest);
    return out;
  }
  if (scheme != "s3") return bad(fmt::format("unsupported scheme '{}' (use s3:// or a path)", scheme));
  out.kind = CacheUrl::Kind::s3;
  auto slash = rest.find('/');
  out.bucket = std::string(rest.substr(0, slash));
  if (out.bucket.empty()) return bad("no bucket name");
  if (auto p = detail::bucket_problem(out.bucket)) return bad(fmt::format("bucket name {}", *p));
  std::string_view prefix = slash == std::string_view::npos ? "" : rest.substr(slash + 1);
  while (!prefix.empty() && prefix.back() == '/') prefix.remove_suffix(1);
  // Every prefix segment must be a real name: S3 would accept "a//b" or "..", but they
  // make keys that no directory cache can mirror.
  for (std::string_view p = prefix; !p.empty();) {
    auto seg = p.substr(0, p.find('/'));
    if (seg.empty() || seg == "." || seg == "..")
      return bad("prefix has an empty, '.' or '..' segment");
    p.remove_prefix(std::min(p.size(), seg.size() + 1));
  }
  out.prefix = std::string(prefix);
  return out;
}

}  // namespace neffcache
