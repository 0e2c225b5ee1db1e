#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct LsOptions {
  std::string cache;  // empty: the Neuron precedence
  std::string state;  // empty: every state
  bool json = false;
};

void setup_ls(CLI::App& app, int& exit_code);
int run_ls(const LsOptions& opts);

}  // namespace neffcache::cli
