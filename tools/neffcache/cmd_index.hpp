#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct IndexOptions {
  std::string cache;  // empty: the Neuron precedence
  bool rebuild = false;
};

void setup_index(CLI::App& app, int& exit_code);
int run_index(const IndexOptions& opts);

}  // namespace neffcache::cli
