#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct FlagsHashOptions {
  std::vector<std::string> flags;
  bool legacy = false;
};

void setup_flags_hash(CLI::App& app, int& exit_code);
int run_flags_hash(const FlagsHashOptions& opts);

}  // namespace neffcache::cli
