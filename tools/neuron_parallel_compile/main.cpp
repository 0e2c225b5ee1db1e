// neuron_parallel_compile [OPTIONS] RUN COMMAND...: a drop-in for the Neuron tool. The
// trial run extracts graphs; each one starts compiling as soon as its "Extracting graphs
// (...)" line appears, while the trial run goes on. As the Neuron tool's argparse
// (parse_known_args) does, its options are recognised anywhere and every other word is
// the trial run's command, in order (args.hpp). main wires the commands: the trial run
// (trial.hpp), the graphs it extracts and their compiles (session.hpp), and the neffcache
// subcommands the other commands are.
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <neffcache/compile/compile.hpp>

#include "common/log.hpp"
#include "neffcache/cmd_analyze.hpp"
#include "neffcache/cmd_clean.hpp"
#include "neffcache/cmd_clear.hpp"
#include "neffcache/cmd_compile.hpp"
#include "neffcache/cmd_scan.hpp"
#include "neffcache/common.hpp"
#include "neuron_parallel_compile/args.hpp"
#include "neuron_parallel_compile/say.hpp"
#include "neuron_parallel_compile/schedule.hpp"
#include "neuron_parallel_compile/session.hpp"
#include "neuron_parallel_compile/trial.hpp"

namespace {

using namespace neffcache;
using namespace neffcache::cli;
using namespace neffcache::npc;

// The share of a multi-node --command compile.
SharePlan compile_share(const Args& a) {
  if (!a.world_size) return {};
  const auto plan = node_plan(a);
  if (a.static_schedule)
    return [plan](const std::vector<std::string>& rels) { return static_shares(rels.size(), plan); };
  return [plan](const std::vector<std::string>& rels) {
    std::vector<std::optional<Priority>> out;
    for (const auto& rel : rels) out.emplace_back(dynamic_share(rel, plan));
    return out;
  };
}

// collect-and-compile, collect and analyze: the trial run, then what the command does
// with its graphs.
int run_with_trial(const Args& a) {
  if (a.run.empty()) return fail(fmt::format("--command {} needs the training command to run", a.command));
  if (a.command == "analyze" && std::filesystem::exists(a.analyze_output) &&
      !std::filesystem::is_directory(a.analyze_output))
    return fail(fmt::format("--analyze-output {}: not a directory", a.analyze_output));
  auto files = prepare_workdir(a.workdir);
  if (!files) return fail(files.error().message);
  std::vector<std::string> env{"NEURON_EXTRACT_GRAPHS_ONLY=1", "NEURON_PARALLEL_COMPILE=1",
                               "NEURON_FALL_BACK_TO_NULL_NEFF=1",
                               "NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG=" + files->cache_log};
  if (a.command == "analyze") env.emplace_back("XLA_HLO_DEBUG=1");
  if (a.world_size)
    info(fmt::format("node {} of {}: this node's share of the graphs first, then what is left", a.node_id, *a.world_size));

  Session session(a, *files);
  std::optional<Error> failure;  // the first error while graphs came in
  const auto t0 = std::chrono::steady_clock::now();
  auto trial = trial_run(a.run, env, files->trial_log, [&](const std::string& path) {
    if (auto r = session.add(path); !r && !failure) failure = r.error();
  });
  if (!trial) return fail(trial.error().message);
  if (failure) return fail(failure->message);
  info(fmt::format("Trial run exited with {}; {} graphs extracted (its output is in {})", trial->exit_code,
                   session.graphs().size(), files->trial_log));
  if (trial->exit_code != 0 && !process_env("NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE")) {
    fmt::print(stderr, "neuron_parallel_compile: error: the trial run failed (exit status {}); set "
                       "NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE=1 to compile the graphs extracted anyway\n",
               trial->exit_code);
    return trial->exit_code;
  }
  if (a.command == "collect") return k_exit_ok;
  auto cache = session.cache();
  if (!cache) return fail(cache.error().message);
  if (a.command == "analyze") {
    if (session.graphs().empty()) return fail("the trial run extracted no graphs, so there is nothing to analyze");
    AnalyzeOptions aopts{(*cache)->name(), {}, a.analyze_output, a.analyze_verbosity};
    aopts.entries = session.graphs();
    return run_analyze(aopts);
  }
  auto overlap = session.overlapped();
  if (!overlap) return fail(overlap.error().message);
  if (!*overlap) {
    // On a mount the daemon compiled each graph as it was written (eager); the report
    // covers the graphs extracted, whether the daemon has finished them or not.
    CompileOptions copts;
    copts.cache = (*cache)->name();
    copts.jobs = a.num_parallel;
    copts.compiler = a.compiler;
    copts.entries = session.graphs();
    copts.seconds_before = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return run_compile(copts);
  }
  auto rc = session.finish(t0);
  if (!rc) return fail(rc.error().message);
  return *rc;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (auto rc = parse_args(argc, argv, a)) return *rc;
  if (auto bad = check_args(a)) return fail(*bad);
  tools::log_threshold() = *tools::parse_log_level(a.log_level);

  if (a.command == "clean") return run_clean({"", true});
  if (a.command == "clear-locks") return run_clear_locks({""});
  if (a.command == "clear-neffs") return run_clear_neffs({""});
  if (a.command == "scan" || a.command == "scan-with-failed") {
    auto tmpl = CompilerTemplate::parse(a.compiler.empty() ? k_default_compiler_template : a.compiler);
    if (!tmpl) return fail(tmpl.error().message);
    return run_scan({"", a.command == "scan-with-failed", false, tmpl->program()});
  }
  if (a.command == "compile") {
    CompileOptions copts;
    copts.jobs = a.num_parallel;
    copts.compiler = a.compiler;
    copts.share = compile_share(a);
    if (a.world_size)
      info(fmt::format("node {} of {}: {}", a.node_id, *a.world_size,
                       a.static_schedule ? "static schedule: the slices of this node's workers first, then those of "
                                           "the 8 workers before each"
                                         : "this node's share of the graphs first, then what is left"));
    return run_compile(copts);
  }
  return run_with_trial(a);
}
