// neuron_parallel_compile's command line: the Neuron tool's options, recognised anywhere
// as its argparse (parse_known_args) does, ours before the command only, and every other
// word, in order, the trial run's command.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <neffcache/compile/scheduler.hpp>

#include "neuron_parallel_compile/schedule.hpp"

namespace neffcache::npc {

// The command line, with the Neuron tool's defaults.
struct Args {
  std::string command = "collect-and-compile";
  int num_parallel = 0;  // 0: default_jobs()
  int node_id = 0;
  std::optional<int> world_size;
  bool static_schedule = false;
  std::string workdir;  // empty: /tmp/$USER/parallel_compile_workdir
  std::string log_level = "INFO";
  std::string analyze_output = "./model_analysis_result";
  int analyze_verbosity = 2;
  std::string compiler;          // empty: the SPEC's default template
  std::string mem_budget, mem_ledger;  // see neffcache compile's
  std::vector<std::string> run;  // the trial run's command

  int workers() const { return num_parallel > 0 ? num_parallel : default_jobs(); }
};

// Parses the command line into `a`. Returns an exit code when there is nothing to run
// (--help, or a wrong command line: exit 2).
std::optional<int> parse_args(int argc, char** argv, Args& a);

// The Neuron tool's rules for the multi-node options; an error message, or nullopt.
std::optional<std::string> check_args(const Args& a);

inline NodePlan node_plan(const Args& a) { return {a.node_id, a.world_size.value_or(1), a.workers()}; }

}  // namespace neffcache::npc
