// Progress of a compile batch on stderr, and the Neuron report at its end: shared by
// `neffcache compile` and `neuron_parallel_compile`.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>

#include <fmt/format.h>

#include <neffcache/batch.hpp>
#include <neffcache/detail/fs.hpp>
#include <neffcache/url.hpp>

namespace neffcache::tools {

// On a terminal, a bar redrawn in place; otherwise the Neuron progress line, printed
// when the counts change (and at most once per `k_line_interval`), as log readers
// and scripts that grep it expect.
class ProgressDisplay {
 public:
  static constexpr std::chrono::seconds k_line_interval{5};

  explicit ProgressDisplay(bool terminal = ::isatty(STDERR_FILENO) == 1) : terminal_(terminal) {}

  void update(const Batch::Counts& c) {
    auto now = std::chrono::steady_clock::now();
    if (terminal_) {
      const std::size_t width = 30, finished = c.done + c.failed;
      std::size_t filled = c.total ? finished * width / c.total : 0;
      auto secs = std::chrono::duration_cast<std::chrono::seconds>(now - start_).count();
      fmt::print(stderr, "\r[{:#<{}}{:.<{}}] {}/{} done, {} failed, {} compiling or queued, {} locked  {:02}:{:02}",
                 "", filled, "", width - filled, c.done, c.total, c.failed, c.remaining, c.locked, secs / 60, secs % 60);
      std::fflush(stderr);
      drawn_ = true;
      return;
    }
    bool changed = c.total != last_.total || c.remaining != last_.remaining || c.locked != last_.locked ||
                   c.done != last_.done || c.failed != last_.failed;
    if (!changed || (printed_ && now - last_print_ < k_line_interval && c.remaining + c.locked > 0)) return;
    fmt::print(stderr, "INFO ||NEURON_CACHE||: Current remaining items are {}, locked are {}, failed are {}, done are {}, total is {}\n",
               c.remaining, c.locked, c.failed, c.done, c.total);
    last_ = c;
    last_print_ = now;
    printed_ = true;
  }

  // Ends the bar's line (a terminal) so later output starts on its own line.
  void finish(const Batch::Counts& c) {
    update(c);
    if (drawn_) fmt::print(stderr, "\n");
  }

 private:
  bool terminal_;
  bool drawn_ = false, printed_ = false;
  Batch::Counts last_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now(), last_print_{};
};

// Prints the Neuron report and totals, as the Neuron tool logs them.
inline void print_neuron_report(std::FILE* out, const nlohmann::ordered_json& report) {
  std::size_t ok = report["compilation_summary"].value("true", 0);
  std::size_t failed = report["compilation_summary"].value("false", 0);
  fmt::print(out, "INFO ||NEURON_PARALLEL_COMPILE||: {}\n", report.dump(4));
  fmt::print(out, "INFO ||NEURON_PARALLEL_COMPILE||: Total graphs: {}\n", ok + failed);
  fmt::print(out, "INFO ||NEURON_PARALLEL_COMPILE||: Total successful compilations: {}\n", ok);
  fmt::print(out, "INFO ||NEURON_PARALLEL_COMPILE||: Total failed compilations: {}\n", failed);
}

// Where NEURON_PARALLEL_COMPILE_DUMP_RESULTS asks the report to be kept as a JSON file:
// "1" or "true" name ./neuron_parallel_compile_report.json, any other value is the path;
// unset, empty or "0": nowhere.
inline std::optional<std::string> report_dump_path() {
  auto v = process_env("NEURON_PARALLEL_COMPILE_DUMP_RESULTS");
  if (!v || v->empty() || *v == "0") return std::nullopt;
  if (*v == "1" || *v == "true" || *v == "True") return std::string("neuron_parallel_compile_report.json");
  return v;
}

// Keeps the report where NEURON_PARALLEL_COMPILE_DUMP_RESULTS says, written whole; a
// failure to write it is reported on stderr and does not change the run's outcome.
inline void dump_report(const nlohmann::ordered_json& report) {
  auto path = report_dump_path();
  if (!path) return;
  if (auto w = detail::write_file_atomic(*path, report.dump(4) + "\n"); !w)
    fmt::print(stderr, "WARNING ||NEURON_PARALLEL_COMPILE||: cannot keep the report: {}\n", w.error().message);
  else
    fmt::print(stderr, "INFO ||NEURON_PARALLEL_COMPILE||: Report kept in {}\n", *path);
}

// The exit status of a compile run: the number of failed graphs, as the Neuron tool
// returns it, kept below 256 so that a shell never sees 0 for a failed run.
inline int failed_exit_status(std::size_t failed) { return static_cast<int>(std::min<std::size_t>(failed, 255)); }

}  // namespace neffcache::tools
