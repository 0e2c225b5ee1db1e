// Definitions of store/open.hpp (core/decl.hpp).
#pragma once

#include <neffcache/store/open.hpp>

namespace neffcache::store {

NEFFCACHE_DECL Result<std::unique_ptr<Store>> open_store(const CacheUrl& url, const EnvLookup& env) {
  if (!url.is_s3()) return std::unique_ptr<Store>(DirectoryStore::open(url.path));
  auto s3 = S3Store::open(url, env);
  if (!s3) return s3.error();
  return std::unique_ptr<Store>(std::move(*s3));
}

NEFFCACHE_DECL Result<std::unique_ptr<Store>> open_store(const std::string& given, const EnvLookup& env) {
  auto url = given.empty() ? resolve_cache_url(env) : parse_cache_url(given);
  if (!url) return url.error();
  return open_store(*url, env);
}

}  // namespace neffcache::store
