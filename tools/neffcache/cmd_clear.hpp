// The two clearings of a cache: neffcache clear-locks and clear-neffs.
#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct ClearOptions {
  std::string cache;  // empty: the Neuron precedence
};

void setup_clear_locks(CLI::App& app, int& exit_code);
int run_clear_locks(const ClearOptions& opts);

void setup_clear_neffs(CLI::App& app, int& exit_code);
int run_clear_neffs(const ClearOptions& opts);

}  // namespace neffcache::cli
