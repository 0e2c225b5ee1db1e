#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct ScanOptions {
  std::string cache;  // empty: the Neuron precedence
  bool with_failed = false;
  bool json = false;
  // The compiler whose folder (neuronxcc-<its version>) is counted when it is installed
  // and the cache has that folder; otherwise every compiler folder is counted.
  std::string compiler = "neuronx-cc";
};

void setup_scan(CLI::App& app, int& exit_code);
int run_scan(const ScanOptions& opts);

}  // namespace neffcache::cli
