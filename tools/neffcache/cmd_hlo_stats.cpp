// neffcache hlo-stats HLO_FILE [--json]: what a graph is made of.
#include "neffcache/cmd_hlo_stats.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/hlo/hlo.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_hlo_stats(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_command(app, exit_code, "hlo-stats",
                                 "Print computations, instructions, parameters and the opcode histogram of an HLO file",
                                 run_hlo_stats);
  sub->add_option("HLO_FILE", opts->hlo_file, "serialized HloModuleProto or HloProto")->required();
  sub->add_flag("--json", opts->json, "print JSON");
}

// Most frequent first; ties in name order, so the output is stable.
void print_histogram(std::string_view title, const std::map<std::string, uint64_t, std::less<>>& counts,
                     std::size_t limit) {
  std::vector<std::pair<std::string, uint64_t>> rows(counts.begin(), counts.end());
  std::stable_sort(rows.begin(), rows.end(), [](auto& a, auto& b) { return a.second > b.second; });
  fmt::print("{}:\n", title);
  rows.resize(std::min(rows.size(), limit));
  for (const auto& [name, n] : rows) fmt::print("  {:>8}  {}\n", n, name);
}

int run_hlo_stats(const HloStatsOptions& opts) {
  auto r = analyze_hlo_file(opts.hlo_file);
  if (!r) return report(r.error());
  const auto& s = r->stats;
  if (opts.json) {
    nlohmann::ordered_json j;
    j["file"] = opts.hlo_file;
    j["format"] = to_string(s.format);
    j["bytes"] = s.bytes;
    j["computations"] = s.computations;
    j["instructions"] = s.instructions;
    j["entry_parameters"] = s.entry_parameters;
    j["graph_hash"] = r->graph_hash;
    j["opcodes"] = s.opcodes;
    j["framework_ops"] = s.framework_ops;
    fmt::print("{}\n", j.dump(2));
    return k_exit_ok;
  }
  fmt::print("file              {}\nformat            {}\nbytes             {}\n", opts.hlo_file,
             to_string(s.format), s.bytes);
  fmt::print("computations      {}\ninstructions      {}\nentry parameters  {}\ngraph hash        {}\n",
             s.computations, s.instructions, s.entry_parameters, r->graph_hash);
  print_histogram("opcodes", s.opcodes);
  if (!s.framework_ops.empty()) print_histogram("framework operators (instruction metadata)", s.framework_ops);
  return k_exit_ok;
}

}  // namespace neffcache::cli
