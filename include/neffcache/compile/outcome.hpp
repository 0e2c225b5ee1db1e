// What a compile of one entry ended in (CompileOutcome, CompileResult), what an entry's
// files already say of it (settled_outcome), and which compiler failures are the
// machine's fault rather than the graph's (resource_exhaustion, neuron_reports_oom).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <neffcache/cache/layout.hpp>
#include <neffcache/core/decl.hpp>

namespace neffcache {

enum class CompileOutcome {
  success,        // compiled and published now
  already_done,   // the entry was done before we got to it
  failed,         // the compiler failed (exit status): model.log recorded
  failed_cached,  // a failure was already recorded and retry_failed is off
  transient,      // killed (oom_killed: for lack of memory), timed out, cancelled, or an
                  // I/O problem: nothing recorded
  busy,           // someone else holds the entry lock
};

NEFFCACHE_DECL const char* to_string(CompileOutcome o);

inline bool is_success(CompileOutcome o) {
  return o == CompileOutcome::success || o == CompileOutcome::already_done;
}

struct CompileResult {
  CompileOutcome outcome = CompileOutcome::transient;
  std::string message;  // one line: why it failed, or who holds the lock
  int attempts = 0;     // compiler runs
  double compile_seconds = 0;
  // The peak resident memory of the compiler's whole process tree (RunResult::peak_rss_kib):
  // the largest over the attempts; for an OOM kill, that run's.
  long peak_rss_kib = 0;
  // Transient because the compiler (or one of its processes) was killed for lack of memory:
  // SIGKILL, exit 137, or neuronx-cc's own report ([F137], exit 70). compile_entry hands
  // it back at once, without using max_retries: retrying with the same memory would be
  // killed again, so the caller retries it with a bigger reservation.
  bool oom_killed = false;
  // Transient because compiles are off (CompileSettings::compiles_off), or because the
  // entry's folder names another compiler (compiler_serves): nothing was run.
  bool refused = false;
  // A result reused from an entry of an equal graph (compile/twin.hpp): that entry, and
  // the compile time its result took, which this one saved.
  std::string twin;
  double saved_seconds = 0;

  // A result without a compiler run.
  static CompileResult of(CompileOutcome o, std::string message = {});
};
// What an entry's files already say of it: done, a recorded failure (unless failures are
// retried), or nothing yet.
inline std::optional<CompileOutcome> settled_outcome(const EntryFiles& f, bool retry_failed) {
  if (f.done()) return CompileOutcome::already_done;
  if (f.failed() && !retry_failed) return CompileOutcome::failed_cached;
  return std::nullopt;
}

namespace detail {

// What a compiler prints when the machine, not the graph, made it fail: a full disk or
// quota, or no memory left on the host (errno texts, Python's and C++'s allocation
// errors). Such a failure is transient: recorded, it would poison an entry that compiles
// once space or memory is back. The compiler's own device-memory errors do not match.
NEFFCACHE_DECL std::optional<std::string_view> resource_exhaustion(std::string_view output);

// neuronx-cc's report that the out-of-memory killer took one of its processes: it exits
// with k_neuron_internal_error_exit and prints "[F137] neuronx-cc was forcibly killed -
// This most commonly occurs due to insufficient system memory...".
inline constexpr int k_neuron_internal_error_exit = 70;
inline constexpr std::string_view k_neuron_oom_mark = "[F137]";

// Whether `output` (what a compiler printed) holds neuronx-cc's out-of-memory report.
inline bool neuron_reports_oom(std::string_view output) {
  return output.find(k_neuron_oom_mark) != std::string_view::npos;
}

}  // namespace detail

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/outcome.ipp>
#endif
