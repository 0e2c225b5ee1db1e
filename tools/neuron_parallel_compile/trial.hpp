// The trial run of neuron_parallel_compile: its work folder and files, the cache it says
// it used, and the run itself (the user's command in graph extraction mode).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include <neffcache/core/result.hpp>

namespace neffcache::npc {

// The files of this run in the work folder.
struct RunFiles {
  std::string trial_log;   // the trial run's output
  std::string cache_log;   // NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG: the cache the trial run used
};

// Creates the work folder `given` (default: /tmp/$USER/parallel_compile_workdir; kept if
// it exists: other runs may be using it) and removes this process's files from an
// earlier run with the same pid.
Result<RunFiles> prepare_workdir(const std::string& given);

// The cache URL the trial run wrote into the cache-path log: its first line that is not
// empty; "" when the run wrote none (the tool's own environment decides then).
std::string cache_from_log(const std::string& path);

struct TrialRun {
  int exit_code = 0;
};

// Runs the user's command in graph extraction mode, with `extra_env` added. Its output
// (stdout and stderr) is shown as it comes and kept in `log_path`; `on_graph` gets the
// PATH of each "Extracting graphs (PATH)" line.
Result<TrialRun> trial_run(const std::vector<std::string>& command, const std::vector<std::string>& extra_env,
                           const std::string& log_path, const std::function<void(const std::string&)>& on_graph);

}  // namespace neffcache::npc
