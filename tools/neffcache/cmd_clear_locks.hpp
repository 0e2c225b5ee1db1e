#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct ClearLocksOptions {
  std::string cache;  // empty: the Neuron precedence
};

void setup_clear_locks(CLI::App& app, int& exit_code);
int run_clear_locks(const ClearLocksOptions& opts);

}  // namespace neffcache::cli
