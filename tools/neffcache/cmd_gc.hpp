#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct GcOptions {
  std::string cache;  // empty: the Neuron precedence
  std::string max_size;
  int keep_compilers = 0;  // 0: keep every compiler folder
  bool dry_run = false;
};

void setup_gc(CLI::App& app, int& exit_code);
int run_gc(const GcOptions& opts);

}  // namespace neffcache::cli
