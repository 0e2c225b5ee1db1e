// How a compile runs: the compiler command template (and whether its program is
// installed), the timeout, retries, work folder root, the user compilers run as, and
// the entry lock's settings. What `neffcache compile`, neuron_parallel_compile and the
// daemon fill from their options.
#pragma once

#include <cstdint>
#include <chrono>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/compile/runner.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

inline constexpr std::string_view k_default_compiler_template =
    "neuronx-cc compile --framework=XLA --target=trn1 {hlo} --output {neff} {flags} --verbose=35";
inline constexpr std::chrono::seconds k_default_compile_timeout{4 * 60 * 60};

// The file `program` runs now: itself when it is a path, else the first executable of
// that name in PATH's folders; nullopt when there is none.
NEFFCACHE_DECL std::optional<std::string> resolve_program(const std::string& program);

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
NEFFCACHE_DECL std::optional<std::string> compiler_version_of(const std::string& program,
                                                              const std::optional<RunAs>& run_as = std::nullopt);

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
  static Result<CompilerTemplate> parse(std::string_view text);

  static const CompilerTemplate& default_template() {
    static const CompilerTemplate t = std::move(parse(k_default_compiler_template).value());
    return t;
  }

  std::vector<std::string> expand(const Values& v) const;

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

// Whether the compiler whose Neuron entries go to the folder `compiler_dir`
// (compiler_dir_name of the version it reports; "" when it reports none) may compile the
// entry at `entry_path` (a folder, or its path in a cache). libneuronxla names a Neuron
// entry's folder neuronxcc-<v> after the full version its compiler reports, and loads
// what is there as that compiler's: so only a compiler that reports exactly <v> compiles
// it. The folder a Neuron entry is in counts as its compiler's whatever its name
// (compiler_dir_of), so an entry under a folder not named neuronxcc-<v> is no compiler's
// to compile; only a path with no folder before the entry is every compiler's. An LNL
// entry's key names its compiler's version itself: any compiler may compile it.
NEFFCACHE_DECL bool compiler_dir_serves(std::string_view entry_path, std::string_view compiler_dir);

// compiler_dir_serves for a compiler `program` that reports `version` (nullopt: none). The
// error is one line naming both versions.
NEFFCACHE_DECL Result<void> compiler_serves(std::string_view entry_path, const std::optional<std::string>& version,
                                            std::string_view program);

// compiler_serves for the compiler of `s`.
inline Result<void> compiler_serves(std::string_view entry_path, const CompileSettings& s) {
  return compiler_serves(entry_path, compiler_version(s), s.compiler.program());
}

// The compiler a run's --compiler option names: `text` parsed as a template (the default
// template when empty); when `check` is Installed::required, its program must be
// runnable now. Errors: a bad template (Errc::invalid_argument, see parse), or
// Errc::not_found "compiler '<program>' not found on PATH".
enum class Installed { required, not_required };
NEFFCACHE_DECL Result<CompilerTemplate> compiler_option(std::string_view text, Installed check);

// Transient-failure retries from NEURON_PARALLEL_COMPILE_MAX_RETRIES (unset or empty:
// 0, the Neuron default). Anything but a whole number from 0 to 100 is an error.
NEFFCACHE_DECL Result<int> max_retries_from_env(const std::function<std::optional<std::string>(const char*)>& env);

// A run's --retries option: `given` when it is 0 or more, else (-1: not given)
// max_retries_from_env, whose errors it returns.
inline Result<int> retries_option(int given, const std::function<std::optional<std::string>(const char*)>& env) {
  if (given >= 0) return given;
  return max_retries_from_env(env);
}

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/settings.ipp>
#endif
