#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct KeyOptions {
  std::string hlo_file;
  std::vector<std::string> flags;  // empty: the compiler flags of NEURON_CC_FLAGS
  std::string compiler_version;    // empty: ask `<compiler> --version`
  std::string compiler = "neuronx-cc";
  std::string explain_file;  // write the canonical text here
  bool legacy = false;
  bool json = false;
};

void setup_key(CLI::App& app, int& exit_code);
int run_key(const KeyOptions& opts);

}  // namespace neffcache::cli
