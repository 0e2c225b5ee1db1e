#pragma once

#include <string>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct SyncOptions {
  std::string direction;  // "push" (directory to S3) or "pull" (S3 to directory)
  std::string dir;
  std::string url;
  int jobs = 8;
  std::string nki_kernels;  // the NKI kernel folder; empty: NEFFCACHE_NKI_KERNELS, else the default
};

void setup_sync(CLI::App& app, int& exit_code);
int run_sync(const SyncOptions& opts);

}  // namespace neffcache::cli
