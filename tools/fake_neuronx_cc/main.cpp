// fake-neuronx-cc: a stand-in for the Neuron compiler, for tests, demos and benchmarks
// on machines without the Neuron SDK. It is not a compiler: it reads the HLO with the
// neffcache library, burns CPU in proportion to the graph's size and writes an artifact
// that names the graph (see fake_neff.hpp). Environment variables (NEFFCACHE_FAKE_*, all
// listed in docs/CONFIGURATION.md, fake-neuronx-cc) inject failures and shape its cost.
//
// Memory: NEFFCACHE_FAKE_MEMORY_MB=N MiB plus, with NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION=K,
// the graph's instructions x K KiB are touched before the compile's time is spent and held
// for all of it. With NEFFCACHE_FAKE_MEMORY_CHILD=1 a forked child touches and holds them
// (the top process stays small: while it runs, only a measure of the whole process tree
// sees the peak; afterwards the child's ru_maxrss reaches its parent's as a reaped child's),
// and a child killed by SIGKILL, as the out-of-memory killer kills the largest process,
// makes the fake print "[F137] neuronx-cc was forcibly killed ..." and exit 70, as the real
// compiler does.
#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <neffcache/core/file.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/hlo/hlo.hpp>

#include "common/version.hpp"
#include "fake_neff.hpp"

namespace {

using namespace neffcache;

constexpr std::string_view k_version = "2.21.0.0+fake";
constexpr double k_default_rate = 50000;  // instructions "compiled" per CPU second

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (!v || !*v) return std::nullopt;
  return std::string(v);
}

// Appends `line` to `path` atomically (O_APPEND, one write), for tests that read it.
void append_line(const std::string& path, const std::string& line) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return;
  (void)!::write(fd, line.data(), line.size());
  ::close(fd);
}

// --logfile: where the compiler keeps its log besides printing it (LNL keeps it as
// log-neuron-cc.txt); empty when not given.
std::string g_logfile;

[[noreturn]] void die(int code, std::string_view message) {
  fmt::print(stderr, "ERROR: {}\n", message);
  if (!g_logfile.empty()) append_line(g_logfile, fmt::format("ERROR: {}\n", message));
  std::exit(code);
}

// Options the real compiler takes with a value (as --opt=V or --opt V) and alone.
bool takes_value(std::string_view o) {
  for (std::string_view k : {"--framework", "--target", "--output", "--model-type", "--auto-cast",
                             "--auto-cast-type", "--distribution-strategy", "--logfile",
                             "--workdir", "--optlevel", "--lnc", "--pipeline", "--verbose"})
    if (o == k) return true;
  return false;
}
bool is_flag(std::string_view o) {
  for (std::string_view k : {"-O1", "-O2", "-O3", "--enable-fast-loading-neuron-binaries",
                             "--enable-saturate-infinity", "--enable-mixed-precision-accumulation",
                             "--enable-fast-context-switch", "--disable-internal-io-dge"})
    if (o == k) return true;
  return o.substr(0, 11) == "--internal-";  // the real compiler has many of these
}

struct Args {
  std::string input, output;
  std::vector<std::string> flags;  // as given, for the artifact
};

Args parse_args(int argc, char** argv) {
  Args a;
  bool saw_compile = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "compile" && !saw_compile) {
      saw_compile = true;
      continue;
    }
    if (arg.empty() || arg[0] != '-') {
      if (!a.input.empty()) die(2, fmt::format("unrecognized arguments: {}", arg));
      a.input = arg;
      continue;
    }
    std::string_view name = arg.substr(0, arg.find('='));
    bool has_eq = name.size() != arg.size();
    if (takes_value(name)) {
      std::string value;
      if (has_eq) value = arg.substr(name.size() + 1);
      else if (i + 1 < argc) value = argv[++i];
      else die(2, fmt::format("argument {}: expected one argument", name));
      if (name == "--output") a.output = value;
      else if (name == "--logfile") g_logfile = value;  // a path: no part of the result
      else if (name != "--framework" && name != "--verbose" && name != "--target")
        a.flags.push_back(fmt::format("{}={}", name, value));
      else if (name == "--target") a.flags.push_back(fmt::format("--target={}", value));
    } else if (is_flag(arg)) {
      a.flags.emplace_back(arg);
    } else {
      die(2, fmt::format("unrecognized arguments: {}", arg));
    }
  }
  if (!saw_compile) die(2, "expected the 'compile' command");
  if (a.input.empty()) die(2, "the following arguments are required: input file");
  if (a.output.empty()) die(2, "the following arguments are required: --output");
  return a;
}

double cpu_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

double wall_seconds() {
  struct timespec ts {};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

// Spends `seconds` of CPU (or, `idle`, of wall time asleep: a compiler running on other
// cores, so that more compiles than this machine has cores can run side by side),
// printing up to ten progress dots as the real compiler does. Calls `check` at least
// every 10 ms meanwhile.
void burn(double seconds, bool idle, const std::function<void()>& check) {
  auto clock = idle ? wall_seconds : cpu_seconds;
  double start = clock();
  volatile uint64_t x = 0x9E3779B97F4A7C15ull;
  int dots = 0;
  for (double spent = 0; spent < seconds; spent = clock() - start) {
    check();
    if (idle) ::usleep(static_cast<useconds_t>(std::min(seconds - spent, 0.01) * 1e6));
    else
      for (int k = 0; k < 100000; ++k) x = x * 6364136223846793005ull + 1442695040888963407ull;
    int due = static_cast<int>(spent / seconds * 10);
    for (; dots < due; ++dots) fmt::print(".");
    std::fflush(stdout);
  }
  for (; dots < 10; ++dots) fmt::print(".");
  fmt::print("\n");
}

// What neuronx-cc prints, before exiting 70, when one of its processes was SIGKILLed.
constexpr std::string_view k_oom_report =
    "[F137] neuronx-cc was forcibly killed - This most commonly occurs due to insufficient system memory.";
constexpr int k_internal_error_exit = 70;

// Memory the compile holds: `kib` KiB, every page touched, here or (`in_child`) in a forked
// child that holds it until release(). A child killed by SIGKILL ends this process as the
// real compiler ends when the OOM killer took one of its workers: k_oom_report, exit 70.
class MemoryHold {
 public:
  MemoryHold(std::size_t kib, bool in_child) {
    if (kib == 0) return;
    const std::size_t bytes = kib << 10;
    if (!in_child) {
      touched_ = touch(bytes);
      touched_bytes_ = bytes;
      fmt::print("touched {} MiB\n", kib >> 10);
      return;
    }
    int ready[2], hold[2];
    if (::pipe2(ready, O_CLOEXEC) != 0 || ::pipe2(hold, O_CLOEXEC) != 0) die(1, "pipe failed");
    std::fflush(stdout);
    child_ = ::fork();
    if (child_ < 0) die(1, fmt::format("fork failed: {}", std::strerror(errno)));
    if (child_ == 0) {
      ::close(ready[0]), ::close(hold[1]);
      touch(bytes);
      (void)!::write(ready[1], "r", 1);
      char c;
      while (::read(hold[0], &c, 1) < 0 && errno == EINTR) {}  // until released, or we are gone
      ::_exit(0);
    }
    ::close(ready[1]), ::close(hold[0]);
    release_fd_ = hold[1];
    char c;
    ssize_t n;
    while ((n = ::read(ready[0], &c, 1)) < 0 && errno == EINTR) {}
    ::close(ready[0]);
    if (n != 1) reap(0);  // died before it held it all
    fmt::print("touched {} MiB in a child process (pid {})\n", kib >> 10, child_);
  }
  ~MemoryHold() {
    if (touched_) ::munmap(touched_, touched_bytes_);
  }
  MemoryHold(const MemoryHold&) = delete;
  MemoryHold& operator=(const MemoryHold&) = delete;

  // While the compile runs: ends this process if the child was killed.
  void check() {
    if (child_ > 0) reap(WNOHANG);
  }
  // The compile's time is spent: the child lets go and is reaped.
  void release() {
    if (child_ <= 0) return;
    ::close(release_fd_);
    reap(0);
  }

 private:
  static void* touch(std::size_t bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die(1, fmt::format("touching {} MiB: Cannot allocate memory", bytes >> 20));
    for (std::size_t i = 0; i < bytes; i += 4096) static_cast<volatile char*>(p)[i] = 1;
    return p;
  }
  void reap(int flags) {
    int status = 0;
    pid_t got;
    while ((got = ::waitpid(child_, &status, flags)) < 0 && errno == EINTR) {}
    if (got == 0) return;  // still holding
    child_ = -1;
    if (got > 0 && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) {
      fmt::print("{}\n", k_oom_report);
      std::fflush(stdout);
      std::exit(k_internal_error_exit);
    }
    if (got < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0 || flags == WNOHANG)
      die(1, "the process holding the compile's memory ended unexpectedly");
  }

  void* touched_ = nullptr;
  std::size_t touched_bytes_ = 0;
  pid_t child_ = -1;
  int release_fd_ = -1;
};

int signal_number(const std::string& s) {
  if (s == "KILL" || s == "SIGKILL") return SIGKILL;
  if (s == "TERM" || s == "SIGTERM") return SIGTERM;
  if (s == "SEGV" || s == "SIGSEGV") return SIGSEGV;
  if (s == "ABRT" || s == "SIGABRT") return SIGABRT;
  if (s == "INT" || s == "SIGINT") return SIGINT;
  return std::atoi(s.c_str());
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::string_view(argv[1]) == "--version" || std::string_view(argv[1]) == "-V")) {
    // The first line as neuronx-cc prints it: the cache wrapper reads the version from it.
    fmt::print("NeuronX Compiler version {}\n\nfake-neuronx-cc (neffcache {}): a stand-in for tests, not a compiler\n",
               env("NEFFCACHE_FAKE_VERSION").value_or(std::string(k_version)), neffcache::program_version());
    return 0;
  }
  Args args = parse_args(argc, argv);

  if (auto log = env("NEFFCACHE_FAKE_LOG")) {
    // One per compile: tests count them, and see who ran it.
    append_line(*log, fmt::format("{} {} {}\n", ::getpid(), ::getuid(), args.input));
  }

  if (auto dir = env("NEFFCACHE_FAKE_EXCLUSIVE_DIR")) {
    // Two compiles of one entry at once are what tests must never see. Each compile holds
    // an flock on a file named after its input (the entry's key) while it runs; the kernel
    // drops it however the compile ends. One that finds it taken records the clash.
    const std::string name = std::filesystem::path(args.input).filename().string();
    int fd = ::open(fmt::format("{}/{}", *dir, name).c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0 || ::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      append_line(fmt::format("{}/clashes", *dir), fmt::format("{} {}\n", ::getpid(), name));
      die(1, fmt::format("{} is being compiled by another process", name));
    }
  }

  auto bytes = read_file(args.input);
  if (!bytes) die(1, bytes.error().message);
  auto hlo = analyze_hlo(*bytes);
  if (!hlo) die(1, fmt::format("{}: {}", args.input, hlo.error().message));

  // Failure injection: for every module, or only when the input path names one of
  // the comma-separated strings in NEFFCACHE_FAKE_ONLY.
  bool targeted = true;
  if (auto only = env("NEFFCACHE_FAKE_ONLY")) {
    targeted = false;
    for (std::string_view rest = *only; !rest.empty();) {
      auto part = rest.substr(0, rest.find(','));
      if (!part.empty() && args.input.find(part) != std::string::npos) targeted = true;
      rest.remove_prefix(std::min(rest.size(), part.size() + 1));
    }
  }
  // The compile's memory, touched before its time is spent and held for all of it (in a
  // child process with NEFFCACHE_FAKE_MEMORY_CHILD=1).
  std::size_t memory_kib = 0;
  if (auto mb = env("NEFFCACHE_FAKE_MEMORY_MB")) memory_kib += std::stoull(*mb) << 10;
  if (auto k = env("NEFFCACHE_FAKE_MEMORY_KIB_PER_INSTRUCTION"))
    memory_kib += static_cast<std::size_t>(hlo->stats.instructions) * std::stoull(*k);
  MemoryHold memory(memory_kib, env("NEFFCACHE_FAKE_MEMORY_CHILD") == "1");

  double rate = k_default_rate;
  if (auto r = env("NEFFCACHE_FAKE_RATE")) rate = std::stod(*r);
  double seconds = rate > 0 ? static_cast<double>(hlo->stats.instructions) / rate : 0;
  if (auto s = env("NEFFCACHE_FAKE_SECONDS")) seconds = std::stod(*s);
  fmt::print("Compiling {} ({} instructions)\n", args.input, hlo->stats.instructions);
  std::fflush(stdout);
  burn(seconds, env("NEFFCACHE_FAKE_IDLE") == "1", [&] { memory.check(); });
  memory.release();

  if (targeted) {
    if (auto once = env("NEFFCACHE_FAKE_SIGNAL_ONCE")) {
      // Dies by a signal (NEFFCACHE_FAKE_ONCE_SIGNAL, default SIGKILL) the first time
      // (marker absent), succeeds afterwards.
      int fd = ::open(once->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
      if (fd >= 0) ::close(fd), ::raise(signal_number(env("NEFFCACHE_FAKE_ONCE_SIGNAL").value_or("KILL")));
    }
    if (auto code = env("NEFFCACHE_FAKE_FAIL")) {
      // With NEFFCACHE_FAKE_FAIL_WHILE=FILE, only while FILE exists. The message is
      // NEFFCACHE_FAKE_FAIL_MESSAGE when given (neuronx-cc's "[F137] ..." with exit 70,
      // say), printed as it is.
      auto gate = env("NEFFCACHE_FAKE_FAIL_WHILE");
      if (!gate || ::access(gate->c_str(), F_OK) == 0) {
        if (auto text = env("NEFFCACHE_FAKE_FAIL_MESSAGE")) {
          fmt::print("{}\n", *text);
          std::fflush(stdout);
          std::exit(std::atoi(code->c_str()));
        }
        die(std::atoi(code->c_str()), "injected compile failure");
      }
    }
    if (env("NEFFCACHE_FAKE_HANG")) {
      // A child in the same process group hangs too: a timeout must kill the group.
      if (::fork() == 0) for (;;) ::pause();
      for (;;) ::pause();
    }
    if (auto sig = env("NEFFCACHE_FAKE_SIGNAL")) {
      // Leave a partial output behind first, as a crashing compiler would.
      int fd = ::open(args.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd >= 0) (void)!::write(fd, fake::k_magic.data(), 5), ::close(fd);
      ::raise(signal_number(*sig));
    }
  }

  std::string body = std::string(fake::k_magic);
  body += fmt::format("graph {}\nflags {}\nstats {} {} {}\n", hlo->canonical_sha256,
                      python_json_list(args.flags), to_string(hlo->stats.format),
                      hlo->stats.computations, hlo->stats.instructions);
  std::size_t padding = 0;
  if (auto p = env("NEFFCACHE_FAKE_NEFF_BYTES")) padding = std::stoull(*p);
  body += fmt::format("padding {}\n", padding);
  // Padding is generated and hashed in pieces: a 1 GiB artifact never sits in memory.
  int fd = ::open(args.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) die(1, fmt::format("cannot write {}: {}", args.output, std::strerror(errno)));
  auto sha = detail::Digest::sha256();
  auto emit = [&](std::string_view piece) {
    sha.update(piece);
    if (auto w = write_all(fd, piece, args.output); !w) die(1, w.error().message);
  };
  emit(body);
  std::mt19937_64 rng(std::hash<std::string>{}(hlo->canonical_sha256));
  std::string chunk(1 << 20, '\0');
  for (std::size_t left = padding; left > 0;) {
    std::size_t n = std::min(left, chunk.size());
    for (std::size_t i = 0; i < n; i += 8) {
      uint64_t v = rng();
      std::memcpy(&chunk[i], &v, std::min<std::size_t>(8, n - i));
    }
    emit(std::string_view(chunk.data(), n));
    left -= n;
  }
  std::string trailer = fmt::format("{}{}\n", fake::k_trailer, sha.hex());
  if (auto w = write_all(fd, trailer, args.output); !w) die(1, w.error().message);
  if (::close(fd) != 0) die(1, fmt::format("cannot write {}: {}", args.output, std::strerror(errno)));
  fmt::print("Compiler status PASS\n");
  if (!g_logfile.empty()) append_line(g_logfile, fmt::format("Compiled {}\nCompiler status PASS\n", args.input));
  return 0;
}
