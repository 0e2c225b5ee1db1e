// The trial run of neuron_parallel_compile (trial.hpp).
#include "neuron_parallel_compile/trial.hpp"

#include <fcntl.h>
#include <pwd.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>

#include <fmt/format.h>

#include <neffcache/core/detail/fs.hpp>

#include "neuron_parallel_compile/say.hpp"

extern char** environ;

namespace neffcache::npc {

namespace {

// /tmp/$USER/parallel_compile_workdir, as the Neuron tool names it.
std::string default_workdir() {
  std::string user = detail::getenv_or("USER", "");
  if (user.empty())
    if (const passwd* pw = ::getpwuid(::geteuid())) user = pw->pw_name;
  return fmt::format("/tmp/{}/parallel_compile_workdir", user.empty() ? std::to_string(::geteuid()) : user);
}

}  // namespace

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
  auto text = detail::read_file(path);
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

}  // namespace neffcache::npc
