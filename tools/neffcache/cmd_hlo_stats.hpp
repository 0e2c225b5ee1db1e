#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>

namespace neffcache::cli {

struct HloStatsOptions {
  std::string hlo_file;
  bool json = false;
};

void setup_hlo_stats(CLI::App& app, int& exit_code);
int run_hlo_stats(const HloStatsOptions& opts);

// Prints `title:` and one line per name, most frequent first (ties in name order), at
// most `limit` lines.
void print_histogram(std::string_view title, const std::map<std::string, uint64_t, std::less<>>& counts,
                     std::size_t limit = SIZE_MAX);

}  // namespace neffcache::cli
