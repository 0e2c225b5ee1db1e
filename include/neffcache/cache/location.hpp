// Where the cache lives: --cache_dir in NEURON_CC_FLAGS, then NEURON_COMPILE_CACHE_URL,
// then /var/tmp/neuron-compile-cache, exactly the precedence of the Neuron cache.
#pragma once

#include <string_view>

#include <fmt/format.h>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/url.hpp>
#include <neffcache/core/env.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

inline constexpr std::string_view k_default_cache_dir = "/var/tmp/neuron-compile-cache";

// Resolves the cache URL with the Neuron precedence. Empty variables count as unset.
// Errors: NEURON_CC_FLAGS that cannot be split, or a malformed URL from either source.
inline Result<CacheUrl> resolve_cache_url(const EnvLookup& env = process_env) {
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
