#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct AnalyzeOptions {
  std::string cache;                 // empty: the Neuron precedence
  std::vector<std::string> entries;  // empty: every entry with an HLO
  std::string output = "model_analysis_result";
  int verbosity = 2;  // 1: XLA opcodes; 2: also the framework operators behind them
};

void setup_analyze(CLI::App& app, int& exit_code);
// Writes <output>/result.json; exit status 1 when a graph could not be read (it is
// listed under "unreadable" and the others are still analyzed).
int run_analyze(const AnalyzeOptions& opts);

}  // namespace neffcache::cli
