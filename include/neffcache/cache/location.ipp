// Definitions of cache/location.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/location.hpp>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL Result<CacheUrl> resolve_cache_url(const EnvLookup& env) {
  if (auto flags = env("NEURON_CC_FLAGS"); flags && !flags->empty()) {
    auto parsed = parse_neuron_cc_flags(*flags);
    if (!parsed)
      return Error{parsed.error().code,
                   fmt::format("NEURON_CC_FLAGS: {}", parsed.error().message)};
    if (parsed->wrapper.cache_dir) return parse_cache_url(*parsed->wrapper.cache_dir);
  }
  if (auto url = env("NEURON_COMPILE_CACHE_URL"); url && !url->empty())
    return parse_cache_url(*url);
  return parse_cache_url(k_default_cache_dir);
}

}  // namespace neffcache
