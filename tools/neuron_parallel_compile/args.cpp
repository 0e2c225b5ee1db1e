// neuron_parallel_compile's command line (args.hpp).
#include "neuron_parallel_compile/args.hpp"

#include <algorithm>
#include <array>
#include <string_view>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <neffcache/compile/compile.hpp>

#include "neffcache/cmd_compile.hpp"
#include "common/version.hpp"
#include "neffcache/common.hpp"

namespace neffcache::npc {

using cli::k_exit_ok;
using cli::k_exit_usage;

namespace {

// The Neuron tool's options, which its argparse (parse_known_args) finds anywhere on the
// command line: those that take a value, and the flags.
constexpr std::array<std::string_view, 8> k_neuron_valued{
    "--command",  "--num_parallel", "--node_id",        "--world_size", "--parallel_compile_workdir",
    "--log_level", "--analyze-output", "--analyze-verbosity"};
constexpr std::array<std::string_view, 1> k_neuron_flags{"--static_schedule"};
// Our additions, found only before the command, so that the command keeps its own.
constexpr std::array<std::string_view, 3> k_own_valued{"--compiler", "--mem-budget", "--mem-ledger"};
constexpr std::array<std::string_view, 3> k_own_flags{"-h", "--help", "--version"};

bool one_of(std::string_view word, auto const& names) {
  return std::find(names.begin(), names.end(), word) != names.end();
}

// Splits the command line as the Neuron tool's parse_known_args does: its options
// anywhere (`--opt value` or `--opt=value`), ours (--compiler, --help, --version) before the
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

}  // namespace

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
  cli::add_memory_options(&app, a.mem_budget, a.mem_ledger);
  app.set_version_flag("--version", fmt::format("neuron_parallel_compile (neffcache) {}", program_version()),
                       "print the version and exit");
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

}  // namespace neffcache::npc
