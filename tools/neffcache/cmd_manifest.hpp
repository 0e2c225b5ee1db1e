#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct ManifestOptions {
  std::string cache;   // empty: the Neuron precedence
  std::string output;  // empty: stdout
};

void setup_manifest(CLI::App& app, int& exit_code);
int run_manifest(const ManifestOptions& opts);

}  // namespace neffcache::cli
