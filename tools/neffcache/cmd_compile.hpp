#pragma once

#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <neffcache/flags.hpp>
#include <neffcache/result.hpp>
#include <neffcache/scheduler.hpp>

namespace neffcache::cli {

struct CompileOptions {
  std::string cache;                 // empty: the Neuron precedence
  std::vector<std::string> entries;  // empty: every entry that needs a compile
  int jobs = 0;                      // 0: default_jobs()
  int retries = -1;                  // -1: NEURON_PARALLEL_COMPILE_MAX_RETRIES or 0
  bool retry_failed = false;
  std::string compiler;              // empty: the SPEC's default template
  double compile_timeout = 0;        // 0: the library default
  bool json = false;
};

void setup_compile(CLI::App& app, int& exit_code);
int run_compile(const CompileOptions& opts);

// The scheduler settings a compile run uses: the template (checked on PATH when this
// process will run it), jobs, retries (NEURON_PARALLEL_COMPILE_MAX_RETRIES by default),
// retry of failures (also from NEURON_CC_FLAGS), flags for entries without
// compile_flags.json, timeout. Shared with neuron_parallel_compile.
Result<Scheduler::Options> scheduler_options(const CompileOptions& opts, const ParsedFlags& env, bool need_compiler);

}  // namespace neffcache::cli
