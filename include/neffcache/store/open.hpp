// Opening the cache a user names: a folder (plain or a neffcachefs mount) or an s3://
// URL, else the Neuron precedence (--cache_dir in NEURON_CC_FLAGS, then
// NEURON_COMPILE_CACHE_URL, then the default folder).
#pragma once

#include <memory>
#include <string>

#include <neffcache/core/decl.hpp>
#include <neffcache/store/directory.hpp>
#include <neffcache/store/s3.hpp>
#include <neffcache/store/store.hpp>
#include <neffcache/cache/location.hpp>
#include <neffcache/cache/url.hpp>

namespace neffcache::store {

// The store of `url`: an S3Store for s3:// (a client, no request yet), else a
// DirectoryStore.
NEFFCACHE_DECL Result<std::unique_ptr<Store>> open_store(const CacheUrl& url, const EnvLookup& env = process_env);

// The store `given` names (a path or URL); empty: the Neuron precedence of `env`.
NEFFCACHE_DECL Result<std::unique_ptr<Store>> open_store(const std::string& given, const EnvLookup& env = process_env);

}  // namespace neffcache::store

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/store/open.ipp>
#endif
