#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <neffcache/cache/flags.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/compile/scheduler.hpp>

#include "neffcache/common.hpp"

namespace neffcache::cli {

// A multi-node run's share of a cache: given the path in the cache of every entry
// (neuronxcc-*/MODULE_*), sorted, what this process takes of each: nullopt (another
// node's, left alone), Priority::background (its own), Priority::deferred (another
// node's, taken when nothing of its own is left).
using SharePlan = std::function<std::vector<std::optional<Priority>>(const std::vector<std::string>& entries)>;

struct CompileOptions {
  std::string cache;                 // empty: the Neuron precedence
  std::vector<std::string> entries;  // empty: every entry that needs a compile
  int jobs = 0;                      // 0: default_jobs()
  int retries = -1;                  // -1: NEURON_PARALLEL_COMPILE_MAX_RETRIES or 0
  bool retry_failed = false;
  std::string compiler;              // empty: the SPEC's default template
  double compile_timeout = 0;        // 0: the library default
  std::string mem_budget;            // empty: NEFFCACHE_MEM_BUDGET, else the default share
  std::string mem_ledger;            // empty: NEFFCACHE_MEM_LEDGER, else k_default_ledger_dir
  bool json = false;
  bool watch = false;           // a compile farm: keep taking entries as they appear (run_watch)
  double watch_interval = 30;   // seconds between listings of the cache while watching
  SharePlan share;              // empty: every entry that needs a compile, alike
  double seconds_before = 0;    // time the run spent before (a trial run): in the dumped total
};

void setup_compile(CLI::App& app, int& exit_code);
// --mem-budget and --mem-ledger, for every command that compiles.
void add_memory_options(CLI::App* app, std::string& budget, std::string& ledger);
int run_compile(const CompileOptions& opts);

// The scheduler settings a compile run uses: the template (checked on PATH when this
// process will run it), jobs, retries (NEURON_PARALLEL_COMPILE_MAX_RETRIES by default),
// retry of failures (also from NEURON_CC_FLAGS), flags for entries without
// compile_flags.json, timeout, the host's memory ledger. Shared with neuron_parallel_compile.
Result<Scheduler::Options> scheduler_options(const CompileOptions& opts, const ParsedFlags& env, bool need_compiler);

}  // namespace neffcache::cli
