#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct RetryOptions {
  std::string cache;                 // empty: the Neuron precedence
  std::vector<std::string> entries;  // the entries to retry...
  bool all = false;                  // ...or every failed one
};

void setup_retry(CLI::App& app, int& exit_code);
int run_retry(const RetryOptions& opts);

}  // namespace neffcache::cli
