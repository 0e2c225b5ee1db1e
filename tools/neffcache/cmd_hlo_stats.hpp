#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct HloStatsOptions {
  std::string hlo_file;
  bool json = false;
};

void setup_hlo_stats(CLI::App& app, int& exit_code);
int run_hlo_stats(const HloStatsOptions& opts);

}  // namespace neffcache::cli
