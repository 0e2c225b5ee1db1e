// Opening the cache a user names: a folder (plain or a neffcachefs mount) or an s3://
// URL, else the Neuron precedence (--cache_dir in NEURON_CC_FLAGS, then
// NEURON_COMPILE_CACHE_URL, then the default folder).
#pragma once

#include <memory>
#include <string>

#include <neffcache/store/directory.hpp>
#include <neffcache/store/s3.hpp>
#include <neffcache/store/store.hpp>
#include <neffcache/cache/location.hpp>
#include <neffcache/cache/url.hpp>

namespace neffcache::store {

// The store of `url`: an S3Store for s3:// (a client, no request yet), else a
// DirectoryStore.
inline Result<std::unique_ptr<Store>> open_store(const CacheUrl& url, const EnvLookup& env = process_env) {
  if (!url.is_s3()) return std::unique_ptr<Store>(DirectoryStore::open(url.path));
  auto s3 = S3Store::open(url, env);
  if (!s3) return s3.error();
  return std::unique_ptr<Store>(std::move(*s3));
}

// The store `given` names (a path or URL); empty: the Neuron precedence of `env`.
inline Result<std::unique_ptr<Store>> open_store(const std::string& given, const EnvLookup& env = process_env) {
  auto url = given.empty() ? resolve_cache_url(env) : parse_cache_url(given);
  if (!url) return url.error();
  return open_store(*url, env);
}

}  // namespace neffcache::store
