#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct ExplainOptions {
  std::string cache;                // empty: the Neuron precedence
  std::string input;                // an HLO file, or an entry of the cache (a folder or a file in one)
  std::vector<std::string> flags;   // empty: the entry's compile_flags.json, else NEURON_CC_FLAGS
  std::string compiler_version;     // empty: the entry's compiler folder, else `<compiler> --version`
  std::string compiler = "neuronx-cc";
  bool json = false;
};

void setup_explain(CLI::App& app, int& exit_code);
// Says whether the graph would hit in the cache (its entry, or a twin of equal content),
// would get a recorded failure, or would miss, and then how it differs from the nearest
// cached graphs. Exit status 0 for any of these; 1 for input that cannot be read.
int run_explain(const ExplainOptions& opts);

}  // namespace neffcache::cli
