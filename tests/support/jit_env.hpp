// The environment of a simulated just-in-time client, which the compiler shim's tests
// (jit.hpp) and bench_jit share: without Catch2, which the benchmarks do not link.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace test {

// env(1) words for a clean Neuron environment for a client of `cache` whose PATH is `path`;
// the fake compiler logs each real compile to `log`, and `fake` (NAME=value words) sets how
// it compiles.
inline std::vector<std::string> jit_env_words(const std::filesystem::path& cache, const std::filesystem::path& log,
                                              const std::string& path, const std::vector<std::string>& fake) {
  std::vector<std::string> words{"env", "-u", "NEURON_CC_FLAGS", "-u", "NEURON_EXTRACT_GRAPHS_ONLY", "-u",
                                 "NEFFCACHE_REAL_COMPILER", "NEURON_COMPILE_CACHE_URL=" + cache.string()};
  words.insert(words.end(), fake.begin(), fake.end());
  words.push_back("NEFFCACHE_FAKE_LOG=" + log.string());
  words.push_back("PATH=" + path);
  return words;
}

}  // namespace test
