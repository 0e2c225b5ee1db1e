// neuron-client-sim: what its parts (main.cpp, libneuronxla.cpp, lnl.cpp) share: the
// options, a graph and what came of it, the log tags, small helpers, and the dialects'
// entry points that main() calls.
#pragma once

#include <sys/stat.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include <neffcache/core/file.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/key.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"

namespace neffcache::clientsim {

namespace fs = std::filesystem;
using SteadyClock = std::chrono::steady_clock;

constexpr const char* k_cache_tag = "INFO ||NEURON_CACHE||:";
constexpr const char* k_wrapper_tag = "INFO ||NEURON_CC_WRAPPER||:";

struct Options {
  std::vector<std::string> inputs;
  std::vector<std::string> flags;
  std::string compiler_version;
  std::string compiler{k_default_compiler_template};
  int steps = 1;
  double extract_interval = 0.1;
  double step_seconds = 0;
  double poll_seconds = 0.2;
  double max_wait = 0;
  bool json = false;
  std::string dialect = "neuron";
  std::string target = "trn1";
  bool save_cache = false;
  std::string key = "canonical";
};

enum class Outcome { extracted, hit, waited, fetched, compiled, failed };

inline const char* to_string(Outcome o) {
  switch (o) {
    case Outcome::extracted: return "extracted";
    case Outcome::hit: return "hit";
    case Outcome::waited: return "waited";
    case Outcome::fetched: return "fetched";
    case Outcome::compiled: return "compiled";
    case Outcome::failed: return "failed";
  }
  return "?";
}

struct Graph {
  std::string input;  // the HLO file given
  std::string bytes;
  std::string canonical_sha256;
  std::string entry;  // its entry folder in the cache
};

struct GraphResult {
  Outcome outcome = Outcome::failed;
  double seconds = 0;  // blocked on the cache: reads, waits for locks, own compiles
  uint64_t neff_bytes = 0;
  std::string error;
};

inline double since(SteadyClock::time_point t) { return std::chrono::duration<double>(SteadyClock::now() - t).count(); }

inline bool exists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

inline void sleep_for(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// Reads a NEFF whole. A fake-neuronx-cc artifact must be intact and name this graph.
inline Result<uint64_t> read_neff(const std::string& path, const Graph& g) {
  auto bytes = read_file(path);
  if (!bytes) return bytes.error();
  if (bytes->starts_with(fake::k_magic)) {
    auto neff = fake::parse_fake_neff(*bytes);
    if (!neff) return Error{Errc::io, fmt::format("{}: a partial or altered NEFF", path)};
    if (neff->graph != g.canonical_sha256)
      return Error{Errc::io, fmt::format("{}: the NEFF of another graph", path)};
  }
  return static_cast<uint64_t>(bytes->size());
}

// The libneuronxla (torch-xla) dialect: libneuronxla.cpp.
GraphResult load(const Graph& g, const Options& opts, const CompilerTemplate& tmpl,
                 const std::vector<std::string>& flags, const std::string& root, const EntryKey& key);

// The LNL dialect (libtorch_neuronx_lite): lnl.cpp.
std::string lnl_cache_root();
GraphResult load_lnl(const Graph& g, const Options& opts, const CompilerTemplate& tmpl,
                     const std::vector<std::string>& flags, const std::string& root, const std::string& key,
                     std::string& saved);

}  // namespace neffcache::clientsim
