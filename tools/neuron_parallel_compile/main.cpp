// neuron_parallel_compile [--command C] [--num_parallel N] RUN COMMAND...: a drop-in for
// the Neuron tool. The trial run extracts graphs; each one starts compiling as soon as
// its "Extracting graphs (...)" line appears, while the trial run goes on.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <regex>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <neffcache/batch.hpp>
#include <neffcache/inventory.hpp>

#include "common/progress.hpp"
#include "neffcache/cmd_analyze.hpp"
#include "neffcache/cmd_clean.hpp"
#include "neffcache/cmd_clear_locks.hpp"
#include "neffcache/cmd_clear_neffs.hpp"
#include "neffcache/cmd_compile.hpp"
#include "neffcache/cmd_scan.hpp"
#include "neffcache/common.hpp"

extern char** environ;

namespace {

using namespace neffcache;

constexpr const char* k_tag = "INFO ||NEURON_PARALLEL_COMPILE||:";
constexpr const char* k_trial_log = "neuron_parallel_compile.log";

struct TrialRun {
  int exit_code = 0;
  std::vector<std::string> graphs;  // HLO paths from "Extracting graphs (...)" lines
};

// Runs the user's command in graph extraction mode. Its output (stdout and stderr) is
// shown as it comes and kept in `log_path`; `on_graph` gets each extracted HLO path.
Result<TrialRun> trial_run(const std::vector<std::string>& command, const std::string& log_path,
                           const std::function<void(const std::string&)>& on_graph) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return sys_error("pipe", command[0]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) env_text.emplace_back(*e);
  for (const char* v : {"NEURON_EXTRACT_GRAPHS_ONLY=1", "NEURON_PARALLEL_COMPILE=1", "NEURON_FALL_BACK_TO_NULL_NEFF=1"})
    env_text.emplace_back(v);
  std::vector<char*> envp, argv;
  for (auto& e : env_text) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> args = command;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid;
  int err = ::posix_spawnp(&pid, argv[0], &fa, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&fa);
  ::close(fds[1]);
  if (err != 0) {
    ::close(fds[0]);
    return sys_error("run", command[0], err);
  }
  std::FILE* log = std::fopen(log_path.c_str(), "w");
  std::FILE* in = ::fdopen(fds[0], "r");
  static const std::regex extracting(R"(Extracting graphs \((.+)\) for ahead-of-time)");
  TrialRun run;
  char* line = nullptr;
  size_t cap = 0;
  for (ssize_t n; (n = ::getline(&line, &cap, in)) > 0;) {
    std::fwrite(line, 1, static_cast<std::size_t>(n), stdout);
    std::fflush(stdout);
    if (log) std::fwrite(line, 1, static_cast<std::size_t>(n), log);
    std::cmatch m;
    if (std::regex_search(line, m, extracting)) {
      run.graphs.push_back(m[1].str());
      on_graph(m[1].str());
    }
  }
  std::free(line);
  std::fclose(in);
  if (log) std::fclose(log);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return run;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace neffcache::cli;
  CLI::App app{"neuron_parallel_compile: extract the graphs of a short trial run and compile them in parallel "
               "into the Neuron compile cache (a drop-in for the Neuron tool)"};
  std::string command = "collect-and-compile", compiler, analyze_output = "./model_analysis_result";
  int num_parallel = 0, analyze_verbosity = 2;
  app.add_option("--command", command, "what to do")
      ->check(CLI::IsMember({"collect-and-compile", "collect", "compile", "clean", "clear-locks", "clear-neffs", "scan",
                             "scan-with-failed", "analyze"}))
      ->capture_default_str();
  app.add_option("--num_parallel", num_parallel, "compiles at once (default: min(cores, ceil(RAM / 64 GiB)))");
  app.add_option("--analyze-output", analyze_output, "with --command analyze: where result.json goes")
      ->capture_default_str();
  app.add_option("--analyze-verbosity", analyze_verbosity,
                 "with --command analyze: 1 for XLA opcodes, 2 to add the framework (aten) operators")
      ->check(CLI::Range(1, 2))
      ->capture_default_str();
  app.add_option("--compiler", compiler, fmt::format("compiler command template (default: {})", k_default_compiler_template));
  app.prefix_command();  // everything from the first word that is not ours is the command to run
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? k_exit_ok : k_exit_usage;
  }
  std::vector<std::string> run = app.remaining();
  auto fail = [](const std::string& msg) {
    fmt::print(stderr, "neuron_parallel_compile: error: {}\n", msg);
    return k_exit_error;
  };

  if (command == "clean") return run_clean({"", true});
  if (command == "clear-locks") return run_clear_locks({""});
  if (command == "clear-neffs") return run_clear_neffs({""});
  if (command == "scan" || command == "scan-with-failed") return run_scan({"", command == "scan-with-failed", false});
  CompileOptions copts;
  copts.jobs = num_parallel;
  copts.compiler = compiler;
  if (command == "compile") return run_compile(copts);

  if (run.empty()) return fail(fmt::format("--command {} needs the training command to run", command));
  // An s3:// cache: the trial run stores its graphs in the bucket, named by their URLs,
  // and they compile here under their leases.
  auto s3 = s3_target("");
  if (!s3) return fail(s3.error().message);
  auto root = *s3 ? Result<std::string>((*s3)->url.text) : cache_root("");
  if (!root) return fail(root.error().message);
  fmt::print(stderr, "INFO ||NEURON_CACHE||: Compile cache path: {}\n", *root);
  const bool on_mount = !*s3 && mount_backing(*root).has_value();
  const bool overlap = command == "collect-and-compile" && !on_mount;
  if (command == "analyze" && std::filesystem::exists(analyze_output) && !std::filesystem::is_directory(analyze_output))
    return fail(fmt::format("--analyze-output {}: not a directory", analyze_output));

  // Compiles start as graphs are extracted (on a mount, the daemon's eager compiles do that).
  std::unique_ptr<Batch> batch;
  auto env = compiler_flags({});
  if (!env) return fail(env.error().message);
  if (overlap) {
    auto so = scheduler_options(copts, *env, /*need_compiler=*/true);
    if (!so) return fail(so.error().message);
    if (*s3) {
      // Entries are named by their URL; the scheduler hands the name back to compile.
      so->compile = [&target = **s3](const std::string& entry, const CompileSettings& settings) {
        return compile_s3_entry(*target.s3, target.url.prefix, entry.substr(target.entry_url("").size()), settings);
      };
    }
    batch = std::make_unique<Batch>(std::move(*so), env->compiler_flags);
  }
  const auto start = std::chrono::system_clock::now();
  const auto t0 = std::chrono::steady_clock::now();
  auto trial = trial_run(run, k_trial_log, [&](const std::string& hlo) {
    if (batch) batch->add(std::filesystem::path(hlo).parent_path().string());
  });
  if (!trial) return fail(trial.error().message);
  fmt::print(stderr, "{} Trial run exited with {}; {} graphs extracted (its output is in {})\n", k_tag,
             trial->exit_code, trial->graphs.size(), k_trial_log);
  if (trial->exit_code != 0 && !process_env("NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE")) {
    fmt::print(stderr, "neuron_parallel_compile: error: the trial run failed (exit status {}); set "
                       "NEURON_IGNORE_TRAINING_SCRIPT_ERROR_AND_COMPILE=1 to compile the graphs extracted anyway\n",
               trial->exit_code);
    return trial->exit_code;
  }
  if (command == "collect") return k_exit_ok;
  if (command == "analyze") {
    if (trial->graphs.empty()) return fail("the trial run extracted no graphs, so there is nothing to analyze");
    AnalyzeOptions aopts{*s3 ? *root : "", {}, analyze_output, analyze_verbosity};
    for (const auto& g : trial->graphs) aopts.entries.push_back(std::filesystem::path(g).parent_path().string());
    return run_analyze(aopts);
  }
  if (!overlap) {
    // On a mount the daemon compiled each graph as it was written (eager); the report
    // covers the graphs extracted, whether the daemon has finished them or not.
    for (const auto& g : trial->graphs) copts.entries.push_back(std::filesystem::path(g).parent_path().string());
    return run_compile(copts);
  }

  // Pending entries the trial run wrote without announcing them count too.
  auto entries = *s3 ? list_s3_entries(*(*s3)->s3, (*s3)->url.prefix) : list_entries(*root);
  if (!entries) return fail(entries.error().message);
  for (const auto& e : *entries)
    if (e.state == EntryState::pending || e.state == EntryState::stale_lock)
      batch->add(*s3 ? (*s3)->entry_url(e.path) : fmt::format("{}/{}", *root, e.path));
  tools::ProgressDisplay display;
  while (!batch->wait_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(250))) display.update(batch->counts());
  display.finish(batch->counts());
  auto report = neuron_report(batch->items(), start, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  tools::print_neuron_report(stdout, report);
  tools::dump_report(report);
  return tools::failed_exit_status(report["compilation_summary"].value("false", std::size_t{0}));
}
