// The cached graphs nearest to one that misses, for `neffcache explain`: entries with the
// same graph under other flags or another compiler, then graphs of the same compiler
// folder compared instruction by instruction.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <neffcache/cache/index.hpp>
#include <neffcache/hlo/diff.hpp>

namespace neffcache::cli {

// Most entries of similar size whose HLO is read and compared with the graph asked for.
inline constexpr std::size_t k_explain_max_reads = 32;
// Nearest entries reported.
inline constexpr std::size_t k_explain_nearest = 3;

// The graph asked about.
struct AskedGraph {
  ContentId id;
  std::vector<std::string> flags;  // compiler flags, wrapper options removed
  uint64_t hlo_bytes = 0;
  HloUnits units;
};

// How a cached entry differs from the graph asked for.
struct Nearest {
  enum class Differs { nothing, flags, compiler, graph };
  std::string entry;  // neuronxcc-*/MODULE_*, relative to the cache root
  bool failed = false;  // a recorded failure rather than a NEFF
  Differs differs = Differs::graph;
  std::string compiler_dir;
  std::vector<std::string> flags_added, flags_removed;  // ours that it lacks; its that we lack
  HloDiff diff;  // for Differs::graph
};

inline const char* to_string(Nearest::Differs d) {
  switch (d) {
    case Nearest::Differs::nothing: return "nothing";
    case Nearest::Differs::flags: return "flags";
    case Nearest::Differs::compiler: return "compiler";
    case Nearest::Differs::graph: return "graph";
  }
  return "graph";
}

// The nearest done or failed entries of the cache whose index is `index` (rooted at the
// backing folder), best first, at most k_explain_nearest; `except` (the entry the graph
// would use) is never one. `default_flags`: the flags of an entry without
// compile_flags.json. Entries that cannot be read are skipped.
std::vector<Nearest> nearest_entries(const ContentIndex& index, const AskedGraph& asked, const std::string& except,
                                     const std::vector<std::string>& default_flags);

}  // namespace neffcache::cli
