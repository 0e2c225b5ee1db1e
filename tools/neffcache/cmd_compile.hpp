#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct CompileOptions {
  std::string cache;                 // empty: the Neuron precedence
  std::vector<std::string> entries;  // empty: every entry that needs a compile
  int jobs = 0;                      // 0: default_jobs()
  int retries = -1;                  // -1: NEURON_PARALLEL_COMPILE_MAX_RETRIES or 0
  bool retry_failed = false;
  std::string compiler;              // empty: the SPEC's default template
  double compile_timeout = 0;        // 0: the library default
  bool json = false;
};

void setup_compile(CLI::App& app, int& exit_code);
int run_compile(const CompileOptions& opts);

}  // namespace neffcache::cli
