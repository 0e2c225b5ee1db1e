// neffcache analyze [--output DIR] [--verbosity 1|2] [ENTRY...]: what the graphs of a
// cache are made of, per graph and for the whole cache, in DIR/result.json.
#include "neffcache/cmd_analyze.hpp"

#include <filesystem>
#include <memory>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/core/file.hpp>
#include <neffcache/hlo/hlo.hpp>
#include <neffcache/cache/inventory.hpp>

#include "neffcache/cmd_hlo_stats.hpp"
#include "neffcache/common.hpp"

namespace neffcache::cli {

namespace {

using Histogram = std::map<std::string, uint64_t, std::less<>>;

struct Graph {
  std::string path;  // as reported: under the cache as given (a folder or a URL)
  store::Entry entry;
  std::string name;  // its HLO file
  std::string state;
};

void add_into(Histogram& total, const Histogram& part) {
  for (const auto& [name, n] : part) total[name] += n;
}

// The graphs to analyze: the entries named, else every entry with an HLO.
Result<std::vector<Graph>> graphs_of(const AnalyzeOptions& opts, const store::Store& cache,
                                     const std::vector<EntryInfo>& entries) {
  std::vector<Graph> graphs;
  std::map<std::string, const EntryInfo*, std::less<>> by_path;
  for (const auto& e : entries) by_path.emplace(e.path, &e);
  auto add = [&](const store::Entry& entry) -> Result<void> {
    auto it = by_path.find(entry.path());
    if (it == by_path.end() || !it->second->files.has_hlo())
      return Error{Errc::not_found, fmt::format("{}: no HLO file in this entry", entry.view())};
    std::string name(*it->second->files.hlo_name());
    graphs.push_back({fmt::format("{}/{}", entry.view(), name), entry, name, to_string(it->second->state)});
    return {};
  };
  if (opts.entries.empty()) {
    for (const auto& [path, e] : by_path)
      if (e->files.has_hlo()) (void)add(cache.entry(*e));
    return graphs;
  }
  for (const auto& arg : opts.entries) {
    auto entry = cache.named(arg);
    if (!entry) return entry.error();
    if (auto r = add(*entry); !r) return r.error();
  }
  return graphs;
}

}  // namespace

void setup_analyze(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(
      app, exit_code, "analyze", "Write the opcode histogram of every graph and of the whole cache to OUTPUT/result.json",
      run_analyze);
  sub->add_option("ENTRY", opts->entries,
                  "entry folders (MODULE_*, or an LNL entry's 32-hex key folder), or files in them; default: every "
                  "graph");
  sub->add_option("--output", opts->output, "directory for result.json")->capture_default_str();
  sub->add_option("--verbosity", opts->verbosity,
                  "1: XLA opcodes; 2: also the framework operators (aten ops, JAX primitives) recorded in "
                  "the instructions' metadata")
      ->check(CLI::Range(1, 2))
      ->capture_default_str();
}

int run_analyze(const AnalyzeOptions& opts) {
  auto cache = open_cache(opts.cache);
  if (!cache) return report(cache.error());
  std::error_code ec;
  std::filesystem::create_directories(opts.output, ec);
  if (ec) return report(fmt::format("{}: cannot create the output directory: {}", opts.output, ec.message()));
  auto entries = (*cache)->list();
  if (!entries) return report(entries.error());
  auto graphs = graphs_of(opts, **cache, *entries);
  if (!graphs) return report(graphs.error());

  nlohmann::ordered_json per_graph = nlohmann::ordered_json::object();
  nlohmann::ordered_json unreadable = nlohmann::ordered_json::object();
  Histogram opcodes, framework_ops;
  uint64_t instructions = 0;
  for (const auto& g : *graphs) {
    // A graph of an S3 cache is read from a copy here, removed once read.
    auto file = (*cache)->local_file(g.entry, g.name);
    auto a = file ? analyze_hlo_file(file->path()) : Result<HloAnalysis>(file.error());
    if (!a) {
      report(a.error());
      unreadable[g.path] = a.error().message;
      continue;
    }
    const auto& s = a->stats;
    nlohmann::ordered_json j{{"state", g.state},
                             {"format", to_string(s.format)},
                             {"bytes", s.bytes},
                             {"computations", s.computations},
                             {"instructions", s.instructions},
                             {"graph_hash", a->graph_hash},
                             {"opcodes", s.opcodes}};
    if (opts.verbosity >= 2) j["framework_ops"] = s.framework_ops;
    per_graph[g.path] = std::move(j);
    instructions += s.instructions;
    add_into(opcodes, s.opcodes);
    add_into(framework_ops, s.framework_ops);
  }
  nlohmann::ordered_json total{{"graphs", per_graph.size()}, {"instructions", instructions}, {"opcodes", opcodes}};
  if (opts.verbosity >= 2) total["framework_ops"] = framework_ops;
  nlohmann::ordered_json result{{"cache", (*cache)->name()},
                                {"verbosity", opts.verbosity},
                                {"total", std::move(total)},
                                {"graphs", std::move(per_graph)},
                                {"unreadable", std::move(unreadable)}};

  const auto file = (std::filesystem::path(opts.output) / "result.json").string();
  if (auto w = write_file_atomic(file, result.dump(2) + "\n"); !w) return report(w.error());

  fmt::print("{} graphs, {} instructions, {} distinct opcodes; written to {}\n", result["total"]["graphs"].get<size_t>(),
             instructions, opcodes.size(), file);
  if (!opcodes.empty()) print_histogram("most used opcodes", opcodes, 10);
  return result["unreadable"].empty() ? k_exit_ok : k_exit_error;
}

}  // namespace neffcache::cli
