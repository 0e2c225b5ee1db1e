// Reading the process environment through an injectable seam, so that code which reads
// variables (the cache URL, the S3 settings, the retry count) can be tested without setenv.
#pragma once

#include <cstdlib>
#include <functional>
#include <optional>
#include <string>

namespace neffcache {

// Reads one environment variable: nullopt when unset. An injectable seam so tests need
// no setenv.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;

// The real environment, read with getenv (an empty variable is an empty string, not unset).
inline std::optional<std::string> process_env(const char* name) {
  const char* v = std::getenv(name);
  if (!v) return std::nullopt;
  return std::string(v);
}

}  // namespace neffcache
