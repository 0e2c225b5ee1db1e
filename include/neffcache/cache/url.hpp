// A cache's address: a directory, or an S3 bucket and prefix (CacheUrl), parsed from
// "s3://bucket/prefix", "file:///dir" or a path. Where the cache lives by default is
// cache/location.hpp.
#pragma once

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

struct CacheUrl {
  enum class Kind { directory, s3 };
  Kind kind = Kind::directory;
  std::string path;    // directory: the root as given (file:// stripped)
  std::string bucket;  // s3: bucket name
  std::string prefix;  // s3: key prefix without leading or trailing '/', may be empty
  std::string text;    // the URL as written, for messages

  bool is_s3() const { return kind == Kind::s3; }
};

namespace detail {

// S3 bucket naming rules: 3-63 characters of a-z 0-9 . -, starting and ending with a
// letter or digit, no "..". Checking here turns a typo into an error at start-up
// rather than a 400 from the server later.
NEFFCACHE_DECL std::optional<std::string> bucket_problem(std::string_view b);

}  // namespace detail

// Parses a cache URL: "s3://bucket[/prefix]", "file:///dir" or a plain path. Anything
// else (empty, another scheme, a bad bucket, a prefix with empty or dot segments) is
// an Errc::invalid_argument error that quotes the URL.
NEFFCACHE_DECL Result<CacheUrl> parse_cache_url(std::string_view url);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/url.ipp>
#endif
