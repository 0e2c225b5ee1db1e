// Where the cache lives: --cache_dir in NEURON_CC_FLAGS, then NEURON_COMPILE_CACHE_URL,
// then /var/tmp/neuron-compile-cache, exactly the precedence of the Neuron cache.
#pragma once

#include <string_view>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/url.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

inline constexpr std::string_view k_default_cache_dir = "/var/tmp/neuron-compile-cache";

// Resolves the cache URL with the Neuron precedence. Empty variables count as unset.
// Errors: NEURON_CC_FLAGS that cannot be split, or a malformed URL from either source.
NEFFCACHE_DECL Result<CacheUrl> resolve_cache_url(const EnvLookup& env = process_env);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/location.ipp>
#endif
