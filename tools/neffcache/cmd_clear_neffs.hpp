#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct ClearNeffsOptions {
  std::string cache;  // empty: the Neuron precedence
};

void setup_clear_neffs(CLI::App& app, int& exit_code);
int run_clear_neffs(const ClearNeffsOptions& opts);

}  // namespace neffcache::cli
