// neuron_parallel_compile [OPTIONS] RUN COMMAND...: a drop-in for the Neuron tool. The
// trial run extracts graphs; each one starts compiling as soon as its "Extracting graphs
// (...)" line appears, while the trial run goes on. As the Neuron tool's argparse
// (parse_known_args) does, its options are recognised anywhere and every other word is
// the trial run's command, in order.
#include <fcntl.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <regex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <neffcache/core/file.hpp>
#include <neffcache/compile/batch.hpp>
#include <neffcache/cache/inventory.hpp>

#include "common/log.hpp"
#include "common/progress.hpp"
#include "neffcache/cmd_analyze.hpp"
#include "neffcache/cmd_clean.hpp"
#include "neffcache/cmd_clear_locks.hpp"
#include "neffcache/cmd_clear_neffs.hpp"
#include "neffcache/cmd_compile.hpp"
#include "neffcache/cmd_scan.hpp"
#include "neffcache/common.hpp"
#include "neuron_parallel_compile/schedule.hpp"

extern char** environ;

namespace {

using namespace neffcache;
using namespace neffcache::cli;
using tools::LogLevel;
using tools::logs;

constexpr const char* k_tag = "||NEURON_PARALLEL_COMPILE||:";

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
  std::vector<std::string> run;  // the trial run's command

  int workers() const { return num_parallel > 0 ? num_parallel : default_jobs(); }
};

int fail(const std::string& msg) {
  fmt::print(stderr, "neuron_parallel_compile: error: {}\n", msg);
  return k_exit_error;
}

void warn(const std::string& msg) {
  if (logs(LogLevel::warning)) fmt::print(stderr, "WARNING {} {}\n", k_tag, msg);
}

void info(const std::string& msg) {
  if (logs(LogLevel::info)) fmt::print(stderr, "INFO {} {}\n", k_tag, msg);
}

void debug(const std::string& msg) {
  if (logs(LogLevel::debug)) fmt::print(stderr, "DEBUG {} {}\n", k_tag, msg);
}

// The Neuron tool's options, which its argparse (parse_known_args) finds anywhere on the
// command line: those that take a value, and the flags.
constexpr std::array<std::string_view, 8> k_neuron_valued{
    "--command",  "--num_parallel", "--node_id",        "--world_size", "--parallel_compile_workdir",
    "--log_level", "--analyze-output", "--analyze-verbosity"};
constexpr std::array<std::string_view, 1> k_neuron_flags{"--static_schedule"};
// Our additions, found only before the command, so that the command keeps its own.
constexpr std::array<std::string_view, 1> k_own_valued{"--compiler"};
constexpr std::array<std::string_view, 2> k_own_flags{"-h", "--help"};

bool one_of(std::string_view word, auto const& names) {
  return std::find(names.begin(), names.end(), word) != names.end();
}

// Splits the command line as the Neuron tool's parse_known_args does: its options
// anywhere (`--opt value` or `--opt=value`), ours (--compiler, --help) before the
// command only, and every other word, in order, is the trial run's command. The first
// "--" ends the options.
std::pair<std::vector<std::string>, std::vector<std::string>> split_args(int argc, char** argv) {
  std::vector<std::string> options{argv[0]}, command;
  bool before_command = true;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      command.insert(command.end(), argv + i + 1, argv + argc);
      break;
    }
    const std::string_view name = std::string_view(arg).substr(0, arg.find('='));
    if (one_of(name, k_neuron_valued) || (before_command && one_of(name, k_own_valued))) {
      options.push_back(arg);
      if (name.size() == arg.size() && i + 1 < argc) options.emplace_back(argv[++i]);
    } else if (one_of(arg, k_neuron_flags) || (before_command && one_of(arg, k_own_flags))) {
      options.push_back(arg);
    } else {
      before_command = false;
      command.push_back(arg);
    }
  }
  return {options, command};
}

// Parses the command line (see split_args). Returns an exit code when there is nothing
// to run (--help, or a wrong command line: exit 2).
std::optional<int> parse_args(int argc, char** argv, Args& a) {
  CLI::App app{"neuron_parallel_compile: extract the graphs of a short trial run and compile them in parallel "
               "into the Neuron compile cache (a drop-in for the Neuron tool). The Neuron tool's options may "
               "stand anywhere; every other word is the trial run's command."};
  app.add_option("--command", a.command, "what to do")
      ->check(CLI::IsMember({"collect-and-compile", "collect", "compile", "clean", "clear-locks", "clear-neffs", "scan",
                             "scan-with-failed", "analyze"}))
      ->capture_default_str();
  app.add_option("--num_parallel", a.num_parallel, "compiles at once on this node (default: min(cores, ceil(RAM / 64 GiB)))")
      ->check(CLI::PositiveNumber);
  app.add_option("--node_id", a.node_id, "this node's index in a multi-node compile")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--world_size", a.world_size, "the number of nodes compiling into one shared cache")
      ->check(CLI::PositiveNumber);
  app.add_flag("--static_schedule", a.static_schedule,
               "with --world_size and --command compile: each worker takes its slice of the sorted entries, then "
               "steals from its 8 preceding workers");
  app.add_option("--parallel_compile_workdir", a.workdir,
                 "where the trial run's log and the cache-path log go (default: /tmp/$USER/parallel_compile_workdir)");
  app.add_option("--log_level", a.log_level, "the tool's own lines below this level are not printed")
      ->check(CLI::IsMember({"DEBUG", "INFO", "WARNING", "ERROR"}))
      ->capture_default_str();
  app.add_option("--analyze-output", a.analyze_output, "with --command analyze: where result.json goes")
      ->capture_default_str();
  app.add_option("--analyze-verbosity", a.analyze_verbosity,
                 "with --command analyze: 1 for XLA opcodes, 2 to add the framework (aten) operators")
      ->check(CLI::Range(1, 2))
      ->capture_default_str();
  app.add_option("--compiler", a.compiler,
                 fmt::format("compiler command template, before the command only (default: {})", k_default_compiler_template));
  auto [options, command] = split_args(argc, argv);
  std::vector<char*> words;
  for (auto& o : options) words.push_back(o.data());
  try {
    app.parse(static_cast<int>(words.size()), words.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? k_exit_ok : k_exit_usage;
  }
  a.run = std::move(command);
  return std::nullopt;
}

// The Neuron tool's rules for the multi-node options; an error message, or nullopt.
std::optional<std::string> check_args(const Args& a) {
  if (a.world_size && a.node_id >= *a.world_size)
    return fmt::format("--node_id {} is not below --world_size {}", a.node_id, *a.world_size);
  if (!a.world_size && a.node_id != 0) return "--node_id needs --world_size";
  if (a.static_schedule && !a.world_size) return "--static_schedule needs --world_size";
  if (a.static_schedule && a.command == "collect-and-compile")
    return "--static_schedule takes every graph of the cache, so it does not work with --command "
           "collect-and-compile (collect first, then run --command compile on every node)";
  return std::nullopt;
}

npc::NodePlan node_plan(const Args& a) { return {a.node_id, a.world_size.value_or(1), a.workers()}; }

// /tmp/$USER/parallel_compile_workdir, as the Neuron tool names it.
std::string default_workdir() {
  std::string user = getenv_or("USER", "");
  if (user.empty())
    if (const passwd* pw = ::getpwuid(::geteuid())) user = pw->pw_name;
  return fmt::format("/tmp/{}/parallel_compile_workdir", user.empty() ? std::to_string(::geteuid()) : user);
}

// The files of this run in the work folder.
struct RunFiles {
  std::string trial_log;   // the trial run's output
  std::string cache_log;   // NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG: the cache the trial run used
};

// Creates the work folder (kept if it exists: other runs may be using it) and removes
// this process's files from an earlier run with the same pid.
Result<RunFiles> prepare_workdir(const std::string& given) {
  const std::string dir = given.empty() ? default_workdir() : given;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec || !std::filesystem::is_directory(dir))
    return Error{Errc::io, fmt::format("--parallel_compile_workdir {}: cannot create it: {}", dir,
                                       ec ? ec.message() : "not a directory")};
  RunFiles f{fmt::format("{}/trial_run_pid{}_log.txt", dir, ::getpid()),
             fmt::format("{}/cache_path_pid{}_log.txt", dir, ::getpid())};
  ::unlink(f.trial_log.c_str());
  ::unlink(f.cache_log.c_str());
  return f;
}

// The cache URL the trial run wrote into the cache-path log: its first line that is not
// empty; "" when the run wrote none (the tool's own environment decides then).
std::string cache_from_log(const std::string& path) {
  auto text = read_file(path);
  if (!text) return "";
  std::string first;
  std::size_t at = 0;
  while (at < text->size()) {
    std::size_t end = text->find('\n', at);
    if (end == std::string::npos) end = text->size();
    std::string line = text->substr(at, end - at);
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ')) line.pop_back();
    at = end + 1;
    if (line.empty()) continue;
    if (first.empty()) first = line;
    else if (line != first) warn(fmt::format("the trial run used several caches; compiling into {}, not {}", first, line));
  }
  return first;
}

// The cache the compile phase works on: a folder (perhaps a neffcachefs mount) or an
// s3:// cache.
struct Cache {
  std::string name;  // its folder or URL
  std::optional<S3Target> s3;
  bool on_mount = false;

  // `given` names it (a path or URL); empty: the Neuron precedence of our environment.
  static Result<Cache> open(const std::string& given) {
    auto s3 = s3_target(given);
    if (!s3) return s3.error();
    Cache c;
    if (*s3) {
      c.name = (*s3)->url.text;
      c.s3 = std::move(*s3);
      return c;
    }
    auto root = cache_root(given);
    if (!root) return root.error();
    c.name = *root;
    c.on_mount = mount_backing(*root).has_value();
    return c;
  }

  // How a batch names an entry given by its path in the cache: its folder or URL.
  std::string entry(const std::string& rel) const { return s3 ? s3->entry_url(rel) : fmt::format("{}/{}", name, rel); }

  // The entry an "Extracting graphs (PATH)" line names, by its path in the cache: PATH
  // is the entry's HLO file, another file in it, or the entry's folder. A PATH that is no
  // entry of this cache is an error.
  Result<std::string> graph(std::string path) const {
    if (!s3) {
      auto e = named_entry(CacheDirs{name, entries_root(name)}, path);
      if (!e) return e.error();
      return e->view.substr(name.size() + 1);
    }
    while (!path.empty() && path.back() == '/') path.pop_back();
    if (auto slash = path.rfind('/'); slash != std::string::npos && !path.substr(slash + 1).starts_with(k_module_dir_prefix))
      path.erase(slash);  // a file of the entry
    return s3_entry_path(path, s3->url);
  }

  // Every entry; none when the cache folder does not exist (a run that extracted nothing).
  Result<std::vector<EntryInfo>> entries() const {
    if (s3) return list_s3_entries(*s3->s3, s3->url.prefix);
    std::error_code ec;
    if (!std::filesystem::exists(name, ec)) return std::vector<EntryInfo>{};
    return list_entries(name);
  }
};

struct TrialRun {
  int exit_code = 0;
};

// Runs the user's command in graph extraction mode, with `extra_env` added. Its output
// (stdout and stderr) is shown as it comes and kept in `log_path`; `on_graph` gets the
// PATH of each "Extracting graphs (PATH)" line.
Result<TrialRun> trial_run(const std::vector<std::string>& command, const std::vector<std::string>& extra_env,
                           const std::string& log_path, const std::function<void(const std::string&)>& on_graph) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return sys_error("pipe", command[0]);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
  std::vector<std::string> env_text;
  for (char** e = environ; *e; ++e) env_text.emplace_back(*e);
  env_text.insert(env_text.end(), extra_env.begin(), extra_env.end());
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
  if (!log) warn(fmt::format("cannot keep the trial run's output in {}: {}", log_path, std::strerror(errno)));
  std::FILE* in = ::fdopen(fds[0], "r");
  static const std::regex extracting(R"(Extracting graphs \(([^)]+)\))");
  char* line = nullptr;
  size_t cap = 0;
  for (ssize_t n; (n = ::getline(&line, &cap, in)) > 0;) {
    std::fwrite(line, 1, static_cast<std::size_t>(n), stdout);
    std::fflush(stdout);
    if (log) std::fwrite(line, 1, static_cast<std::size_t>(n), log);
    std::cmatch m;
    if (std::regex_search(line, m, extracting)) on_graph(m[1].str());
  }
  std::free(line);
  std::fclose(in);
  if (log) std::fclose(log);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {}
  return TrialRun{WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status)};
}

// The graphs of a trial run and, for collect-and-compile off a mount, their compiles,
// started as the graphs are extracted. The cache is the one the trial run says it used
// (the cache-path log), looked at when the first graph appears.
class Session {
 public:
  Session(const Args& a, RunFiles files) : args_(a), files_(std::move(files)) {}

  // The cache, resolved once.
  Result<const Cache*> cache() {
    if (!cache_) {
      const std::string logged = cache_from_log(files_.cache_log);
      auto c = Cache::open(logged);
      if (!c) return Error{c.error().code, logged.empty() ? c.error().message
                                                          : fmt::format("the cache the trial run used: {}", c.error().message)};
      cache_ = std::move(*c);
      if (!logged.empty()) debug(fmt::format("the trial run used the cache {}", logged));
    }
    return &*cache_;
  }

  // Whether graphs compile here as they come (else the command or the daemon does).
  Result<bool> overlapped() {
    auto c = cache();
    if (!c) return c.error();
    return args_.command == "collect-and-compile" && !(*c)->on_mount;
  }

  // An "Extracting graphs (PATH)" line: a graph, or a warning when PATH is no entry of the cache.
  Result<void> add(const std::string& path) {
    auto c = cache();
    if (!c) return c.error();
    auto rel = (*c)->graph(path);
    if (!rel) {
      warn(fmt::format("{} is not a graph of the cache {} ({}); it is left out", path, (*c)->name, rel.error().message));
      return {};
    }
    if (std::find(graphs_.begin(), graphs_.end(), *rel) != graphs_.end()) return {};
    graphs_.push_back(*rel);
    auto overlap = overlapped();
    if (!overlap) return overlap.error();
    if (!*overlap) return {};
    if (!batch_)
      if (auto b = start_batch(**c); !b) return b;
    // Another node's graph waits for the end of the trial run: ours go first.
    const Priority share = npc::dynamic_share(*rel, node_plan(args_));
    debug(fmt::format("{}: {}", *rel, share == Priority::background ? "this node's share" : "another node's share"));
    if (share == Priority::background) batch_->add((*c)->entry(*rel));
    else later_.push_back(*rel);
    return {};
  }

  const std::vector<std::string>& graphs() const { return graphs_; }

  // After the trial run: the other nodes' graphs, and pending entries the run wrote
  // without announcing them, compile too; waits for every compile and reports.
  Result<int> finish(const std::chrono::steady_clock::time_point t0) {
    auto c = cache();
    if (!c) return c.error();
    if (!batch_)
      if (auto b = start_batch(**c); !b) return b.error();
    const auto plan = node_plan(args_);
    for (const auto& rel : later_) batch_->add((*c)->entry(rel), Priority::deferred);
    auto entries = (*c)->entries();
    if (!entries) return entries.error();
    for (const auto& e : *entries)
      if (e.state == EntryState::pending || e.state == EntryState::stale_lock)
        batch_->add((*c)->entry(e.path), npc::dynamic_share(e.path, plan));
    tools::ProgressDisplay display;
    while (!batch_->wait_until(std::chrono::steady_clock::now() + std::chrono::milliseconds(250)))
      display.update(batch_->counts());
    display.finish(batch_->counts());
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto report = neuron_report(batch_->items(), start_, seconds);
    tools::print_neuron_report(stdout, report);
    tools::dump_report(report, seconds);
    return tools::failed_exit_status(report["compilation_summary"].value("false", std::size_t{0}));
  }

 private:
  Result<void> start_batch(const Cache& c) {
    CompileOptions copts;
    copts.jobs = args_.num_parallel;
    copts.compiler = args_.compiler;
    auto env = compiler_flags({});
    if (!env) return env.error();
    auto so = scheduler_options(copts, *env, /*need_compiler=*/true);
    if (!so) return so.error();
    if (c.s3) so->compile = s3_compile(*c.s3);
    if (logs(LogLevel::info)) fmt::print(stderr, "INFO ||NEURON_CACHE||: Compile cache path: {}\n", c.name);
    batch_ = std::make_unique<Batch>(std::move(*so), env->compiler_flags);
    return {};
  }

  const Args& args_;
  RunFiles files_;
  std::optional<Cache> cache_;
  std::vector<std::string> graphs_;  // by their path in the cache, in the order extracted
  std::vector<std::string> later_;   // other nodes' graphs, compiled after the trial run
  std::unique_ptr<Batch> batch_;
  std::chrono::system_clock::time_point start_ = std::chrono::system_clock::now();
};

// The share of a multi-node --command compile.
SharePlan compile_share(const Args& a) {
  if (!a.world_size) return {};
  const auto plan = node_plan(a);
  if (a.static_schedule)
    return [plan](const std::vector<std::string>& rels) { return npc::static_shares(rels.size(), plan); };
  return [plan](const std::vector<std::string>& rels) {
    std::vector<std::optional<Priority>> out;
    for (const auto& rel : rels) out.emplace_back(npc::dynamic_share(rel, plan));
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
    AnalyzeOptions aopts{(*cache)->name, {}, a.analyze_output, a.analyze_verbosity};
    aopts.entries = session.graphs();
    return run_analyze(aopts);
  }
  auto overlap = session.overlapped();
  if (!overlap) return fail(overlap.error().message);
  if (!*overlap) {
    // On a mount the daemon compiled each graph as it was written (eager); the report
    // covers the graphs extracted, whether the daemon has finished them or not.
    CompileOptions copts;
    copts.cache = (*cache)->name;
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
