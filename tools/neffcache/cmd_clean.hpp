#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct CleanOptions {
  std::string cache;  // empty: the Neuron precedence
  bool yes = false;   // no question asked
};

void setup_clean(CLI::App& app, int& exit_code);
int run_clean(const CleanOptions& opts);

}  // namespace neffcache::cli
