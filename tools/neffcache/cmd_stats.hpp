#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct StatsOptions {
  std::string cache;  // empty: the Neuron precedence
  std::string format = "text";  // text, json or prometheus
};

void setup_stats(CLI::App& app, int& exit_code);
int run_stats(const StatsOptions& opts);

}  // namespace neffcache::cli
