#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

struct KeyOptions {
  GraphInputs graph;
  std::string explain_file;  // write the canonical text here
  bool legacy = false;
  bool json = false;
};

void setup_key(CLI::App& app, int& exit_code);
int run_key(const KeyOptions& opts);

}  // namespace neffcache::cli
