#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct ScanOptions {
  std::string cache;  // empty: the Neuron precedence
  bool with_failed = false;
  bool json = false;
};

void setup_scan(CLI::App& app, int& exit_code);
int run_scan(const ScanOptions& opts);

}  // namespace neffcache::cli
