#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct VerifyOptions {
  std::string cache;  // empty: the Neuron precedence
  bool repair = false;
};

void setup_verify(CLI::App& app, int& exit_code);
int run_verify(const VerifyOptions& opts);

}  // namespace neffcache::cli
