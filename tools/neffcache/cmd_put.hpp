#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

struct PutOptions {
  GraphInputs graph;
  std::string cache;  // empty: the Neuron precedence
  bool json = false;
};

void setup_put(CLI::App& app, int& exit_code);
int run_put(const PutOptions& opts);

}  // namespace neffcache::cli
