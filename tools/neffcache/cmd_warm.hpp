#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct WarmOptions {
  std::string manifest;
  std::string cache;        // the bucket; empty: the manifest's
  std::string local_cache;  // the tier folder a daemon will mount
  std::string local_cache_size = "50G";
  int jobs = 16;
};

void setup_warm(CLI::App& app, int& exit_code);
int run_warm(const WarmOptions& opts);

}  // namespace neffcache::cli
