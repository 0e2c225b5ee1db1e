// How a compile runs: the compiler command template (and whether its program is
// installed), the timeout, retries, work folder root, the user compilers run as, and
// the entry lock's settings. What `neffcache compile`, neuron_parallel_compile and the
// daemon fill from their options.
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <sys/stat.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <cstdint>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/compile/runner.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

inline constexpr std::string_view k_default_compiler_template =
    "neuronx-cc compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags} --verbose=35";
inline constexpr std::chrono::seconds k_default_compile_timeout{4 * 60 * 60};

// The file `program` runs now: itself when it is a path, else the first executable of
// that name in PATH's folders; nullopt when there is none.
inline std::optional<std::string> resolve_program(const std::string& program) {
  if (program.find('/') != std::string::npos)
    return ::access(program.c_str(), X_OK) == 0 ? std::optional<std::string>(program) : std::nullopt;
  const char* path = std::getenv("PATH");
  for (std::string_view rest = path ? path : ""; !rest.empty();) {
    auto dir = rest.substr(0, rest.find(':'));
    if (std::string file = fmt::format("{}/{}", dir, program); !dir.empty() && ::access(file.c_str(), X_OK) == 0)
      return file;
    rest.remove_prefix(std::min(rest.size(), dir.size() + 1));
  }
  return std::nullopt;
}

// Whether `program` can be run now (resolve_program).
inline bool runnable(const std::string& program) { return resolve_program(program).has_value(); }

// The version of the compiler `program` as `<program> --version` reports it in neuronx-cc's
// words ("... Compiler version <v>"; a wrapper such as `nice` or `env`, whose output names
// other versions, gives none), run as `run_as` when given (root runs no compiler, not even
// to ask its version), asked once per program file and user: the answer is kept while the
// file it resolves to is the same (inode, size, change time), so a compiler upgraded in
// place is asked again at its next use; a failure is asked again after a minute. nullopt
// when it cannot be run or names no version. Thread-safe; the query runs without the
// lock, so two first callers may both ask.
inline std::optional<std::string> compiler_version_of(const std::string& program,
                                                      const std::optional<RunAs>& run_as = std::nullopt) {
  constexpr auto k_retry_failure = std::chrono::minutes(1);
  struct Known {
    ino_t ino = 0;
    off_t size = 0;
    int64_t ctime_ns = 0;
    std::optional<std::string> version;
    std::chrono::steady_clock::time_point asked{};
    bool same_file(const Known& o) const { return ino == o.ino && size == o.size && ctime_ns == o.ctime_ns; }
  };
  static std::mutex mu;  // guards known; a leaf
  static std::map<std::string, Known, std::less<>> known;
  auto file = resolve_program(program);
  struct stat st {};
  if (!file || ::stat(file->c_str(), &st) != 0) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  Known k{st.st_ino, st.st_size, static_cast<int64_t>(st.st_ctim.tv_sec) * 1'000'000'000 + st.st_ctim.tv_nsec, {}, now};
  const std::string asker = run_as ? fmt::format("{}\n{}", *file, run_as->uid) : *file;
  {
    std::lock_guard lock(mu);
    if (auto it = known.find(asker);
        it != known.end() && it->second.same_file(k) && (it->second.version || now - it->second.asked < k_retry_failure))
      return it->second.version;
  }
  std::vector<std::string> argv{*file, "--version"};
  if (run_as) argv = run_as->command(std::move(argv));
  if (auto run = detail::run_capture(argv, k_version_query_timeout); run && run->exit_code == 0)
    if (auto at = run->output.find("Compiler version"); at != std::string::npos)
      if (auto v = parse_compiler_version(std::string_view(run->output).substr(at))) k.version = std::move(*v);
  std::lock_guard lock(mu);
  known.insert_or_assign(asker, k);
  return k.version;
}

// A compiler command line with placeholders, split like NEURON_CC_FLAGS (no shell).
// {hlo} {neff} {workdir} {key} may stand inside a word ("--output={neff}"); {flags}
// must be a word of its own and becomes one word per flag.
class CompilerTemplate {
 public:
  struct Values {
    std::string hlo, neff, workdir, key;
    std::vector<std::string> flags;
  };

  // Errors (Errc::invalid_argument): empty, bad quoting, unknown placeholder, a stray
  // brace, {flags} inside a word, or no {hlo} or {neff}.
  static Result<CompilerTemplate> parse(std::string_view text) {
    auto bad = [&](std::string_view why) {
      return Error{Errc::invalid_argument, fmt::format("bad compiler template '{}': {}", text, why)};
    };
    auto words = shell_split(text);
    if (!words) return bad(words.error().message);
    if (words->empty()) return bad("empty");
    bool hlo = false, neff = false;
    for (const auto& w : *words) {
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (w[i] == '}') return bad("'}' without '{'");
        if (w[i] != '{') continue;
        auto end = w.find('}', i);
        if (end == std::string::npos) return bad("'{' without '}'");
        std::string_view name(w.data() + i + 1, end - i - 1);
        if (name == "flags" && w != "{flags}") return bad("{flags} must be a word of its own");
        if (name != "hlo" && name != "neff" && name != "flags" && name != "workdir" && name != "key")
          return bad(fmt::format("unknown placeholder {{{}}} (known: hlo neff flags workdir key)", name));
        hlo |= name == "hlo";
        neff |= name == "neff";
        i = end;
      }
    }
    if (!hlo || !neff) return bad("it needs both {hlo} and {neff}");
    return CompilerTemplate(std::move(*words), std::string(text));
  }

  static const CompilerTemplate& default_template() {
    static const CompilerTemplate t = std::move(parse(k_default_compiler_template).value());
    return t;
  }

  std::vector<std::string> expand(const Values& v) const {
    std::vector<std::string> out;
    for (const auto& w : words_) {
      if (w == "{flags}") {
        out.insert(out.end(), v.flags.begin(), v.flags.end());
        continue;
      }
      std::string s;
      for (std::size_t i = 0; i < w.size(); ++i) {
        if (w[i] != '{') {
          s += w[i];
          continue;
        }
        auto end = w.find('}', i);
        std::string_view name(w.data() + i + 1, end - i - 1);
        s += name == "hlo" ? v.hlo : name == "neff" ? v.neff : name == "workdir" ? v.workdir : v.key;
        i = end;
      }
      out.push_back(std::move(s));
    }
    return out;
  }

  const std::string& text() const { return text_; }
  // The program it runs: a path, or a name looked up on PATH.
  const std::string& program() const { return words_.front(); }

  // Whether program() can be run now (see runnable()).
  bool installed() const { return runnable(program()); }

 private:
  CompilerTemplate(std::vector<std::string> words, std::string text)
      : words_(std::move(words)), text_(std::move(text)) {}
  std::vector<std::string> words_;
  std::string text_;
};

struct CompileSettings {
  CompilerTemplate compiler = CompilerTemplate::default_template();
  // Flags for entries without compile_flags.json (wrapper options are removed).
  std::vector<std::string> default_flags;
  std::chrono::milliseconds timeout = k_default_compile_timeout;
  std::chrono::milliseconds kill_grace{10'000};
  int max_retries = 0;        // extra attempts after a transient failure
  bool retry_failed = false;  // compile entries with a recorded failure again
  std::string workdir_root;   // default: $TMPDIR or /tmp
  // Compilers run as this user (we must be root); work folders are theirs. Whoever runs
  // them, the files a compile writes into an entry belong to the entry HLO's owner when
  // we are root.
  std::optional<RunAs> run_as;
  // The version the compiler reports, where the caller knows it without asking (a stand-in
  // runner's); nullopt: asked with `--version` (compiler_version).
  std::optional<std::string> compiler_version;
  LockOptions lock;
  ProcessRunner* runner = nullptr;  // default: a PosixRunner
  // Asked between heartbeats; returning true stops the compile as a transient failure.
  std::function<bool()> cancelled;
  // Reuse results of equal graphs compiled before, and record new ones (the content
  // index, compile/twin.hpp).
  bool content_index = true;
  // Non-empty: compiles are off, and this says why ("--no-compile"). A job that needs a
  // compile ends at once as a transient failure marked `refused`, before it locks or
  // writes anything; done entries and reused results of equal graphs are still served.
  std::string compiles_off;
  // Where the library reports what it noticed and went on from (a content-index record
  // dropped or not written): one line each. Empty: nowhere.
  std::function<void(std::string_view)> log;
  // Set per compile by a scheduler that admits compiles by memory, on its own copy of the
  // settings; compile_entry only writes them into the entry's metadata
  // (.neffcache-meta.json, beside the measured peak_rss_kib). The memory reservation this
  // compile was admitted with, in KiB (0: none) ...
  uint64_t predicted_peak_kib = 0;
  // ... and how many earlier attempts of this job were killed for lack of memory
  // (CompileResult::oom_killed).
  int oom_retries = 0;
};

// The version of the compiler of `s`: s.compiler_version when set, else what its program
// reports, asked as the user compiles run as (compiler_version_of). It decides which
// Neuron entries `s` may compile (compiler_serves) and names the content identity of the
// LNL entries it compiles (index.hpp).
inline std::optional<std::string> compiler_version(const CompileSettings& s) {
  if (s.compiler_version) return s.compiler_version;
  return compiler_version_of(s.compiler.program(), s.run_as);
}

// Whether a compiler `program` that reports `version` (nullopt: none) may compile the
// entry at `entry_path` (a folder, or its path in a cache). libneuronxla names a Neuron
// entry's folder neuronxcc-<v> after the full version its compiler reports, and loads
// what is there as that compiler's: so only a compiler that reports exactly <v> compiles
// it. An LNL entry's key names its compiler's version itself: any compiler may. The
// error is one line naming both versions.
inline Result<void> compiler_serves(std::string_view entry_path, const std::optional<std::string>& version,
                                    std::string_view program) {
  const std::string dir = compiler_dir_of(entry_path);
  if (dir.empty()) return {};
  if (version && dir == compiler_dir_name(*version)) return {};
  std::string_view wanted = std::string_view(dir).substr(dir.starts_with(k_compiler_dir_prefix) ? k_compiler_dir_prefix.size() : 0);
  return Error{Errc::invalid_argument,
               version ? fmt::format("{}: not compiled: its folder is for compiler {}, and '{}' reports {}", entry_path,
                                     wanted, program, *version)
                       : fmt::format("{}: not compiled: its folder is for compiler {}, and '{}' reports no version "
                                     "('{} --version')",
                                     entry_path, wanted, program, program)};
}

// compiler_serves for the compiler of `s`.
inline Result<void> compiler_serves(std::string_view entry_path, const CompileSettings& s) {
  return compiler_serves(entry_path, compiler_version(s), s.compiler.program());
}

// The compiler a run's --compiler option names: `text` parsed as a template (the default
// template when empty); when `check` is Installed::required, its program must be
// runnable now. Errors: a bad template (Errc::invalid_argument, see parse), or
// Errc::not_found "compiler '<program>' not found on PATH".
enum class Installed { required, not_required };
inline Result<CompilerTemplate> compiler_option(std::string_view text, Installed check) {
  auto tmpl = CompilerTemplate::parse(text.empty() ? k_default_compiler_template : text);
  if (!tmpl) return tmpl.error();
  if (check == Installed::required && !tmpl->installed())
    return Error{Errc::not_found, fmt::format("compiler '{}' not found on PATH", tmpl->program())};
  return tmpl;
}

// Transient-failure retries from NEURON_PARALLEL_COMPILE_MAX_RETRIES (unset or empty:
// 0, the Neuron default). Anything but a whole number from 0 to 100 is an error.
inline Result<int> max_retries_from_env(const std::function<std::optional<std::string>(const char*)>& env) {
  auto v = env("NEURON_PARALLEL_COMPILE_MAX_RETRIES");
  if (!v || v->empty()) return 0;
  int n = 0;
  bool ok = v->size() <= 3;
  for (char c : *v) ok = ok && c >= '0' && c <= '9', n = n * 10 + (c - '0');
  if (!ok || n > 100)
    return Error{Errc::invalid_argument,
                 fmt::format("NEURON_PARALLEL_COMPILE_MAX_RETRIES='{}' is not a number from 0 to 100", *v)};
  return n;
}

// A run's --retries option: `given` when it is 0 or more, else (-1: not given)
// max_retries_from_env, whose errors it returns.
inline Result<int> retries_option(int given, const std::function<std::optional<std::string>(const char*)>& env) {
  if (given >= 0) return given;
  return max_retries_from_env(env);
}

}  // namespace neffcache
