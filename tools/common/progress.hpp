// Progress of a compile batch on stderr, and the Neuron report at its end: shared by
// `neffcache compile` and `neuron_parallel_compile`.
#pragma once

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <ctime>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include <neffcache/core/file.hpp>
#include <neffcache/compile/batch.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/cache/location.hpp>

#include "common/log.hpp"

namespace neffcache::tools {

// On a terminal, a bar redrawn in place; otherwise the Neuron progress line (an INFO line), printed
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
    if (!logs(LogLevel::info)) return;
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

// Prints the Neuron report and totals, as the Neuron tool logs them (INFO lines).
inline void print_neuron_report(std::FILE* out, const nlohmann::ordered_json& report) {
  if (!logs(LogLevel::info)) return;
  std::size_t ok = report["compilation_summary"].value("true", 0);
  std::size_t failed = report["compilation_summary"].value("false", 0);
  fmt::print(out, "INFO ||NEURON_PARALLEL_COMPILE||: {}\n", report.dump(4));
  fmt::print(out, "INFO ||NEURON_PARALLEL_COMPILE||: Total graphs: {}\n", ok + failed);
  fmt::print(out, "INFO ||NEURON_PARALLEL_COMPILE||: Total successful compilations: {}\n", ok);
  fmt::print(out, "INFO ||NEURON_PARALLEL_COMPILE||: Total failed compilations: {}\n", failed);
}

// One line on stderr (at the warning level) for each graph of a run that did not
// compile, saying why: a recorded failure's log is in its entry, but a transient one
// (a kernel missing, a kill) is said nowhere else.
inline void print_failures(const std::vector<Batch::Item>& items) {
  if (!logs(LogLevel::warning)) return;
  for (const auto& item : items)
    if (item.result && !is_success(item.result->outcome) && !item.result->message.empty())
      fmt::print(stderr, "WARNING ||NEURON_CACHE||: {}: not compiled: {}\n", item.entry_dir, item.result->message);
}

// Where NEURON_PARALLEL_COMPILE_DUMP_RESULTS asks the report to be kept as a JSON file of
// ours: "1" or "true" name ./neuron_parallel_compile_report.json, any other value is the
// path; unset, empty or "0": nowhere (and no dump at all).
inline std::optional<std::string> report_dump_path() {
  auto v = process_env("NEURON_PARALLEL_COMPILE_DUMP_RESULTS");
  if (!v || v->empty() || *v == "0") return std::nullopt;
  if (*v == "1" || *v == "true" || *v == "True") return std::string("neuron_parallel_compile_report.json");
  return v;
}

// The files the Neuron tool dumps in the working directory, named by the Unix time
// `now` (which keeps the files of several nodes apart): the report, and the run's total
// time (`total_neuron_parallel_compile_time`, seconds).
inline std::vector<std::pair<std::string, std::string>> neuron_dump_files(const nlohmann::ordered_json& report,
                                                                          double total_seconds, std::time_t now) {
  nlohmann::ordered_json total{{"total_neuron_parallel_compile_time", total_seconds}};
  return {{fmt::format("neuron_parallel_compile_results_{}.json", now), report.dump(4) + "\n"},
          {fmt::format("total_neuron_parallel_compile_results_{}.json", now), total.dump(4) + "\n"}};
}

// With NEURON_PARALLEL_COMPILE_DUMP_RESULTS set: keeps the report where it says (see
// report_dump_path), and writes the Neuron tool's two files (see neuron_dump_files),
// each whole. A failure to write one is a warning on stderr and does not change the
// run's outcome. `total_seconds` is the whole run's time, trial run included.
inline void dump_report(const nlohmann::ordered_json& report, double total_seconds) {
  auto path = report_dump_path();
  if (!path) return;
  auto files = neuron_dump_files(report, total_seconds, std::time(nullptr));
  files.emplace_back(*path, report.dump(4) + "\n");
  for (const auto& [name, text] : files) {
    if (auto w = write_file_atomic(name, text); !w) {
      if (logs(LogLevel::warning))
        fmt::print(stderr, "WARNING ||NEURON_PARALLEL_COMPILE||: cannot keep the report: {}\n", w.error().message);
    } else if (logs(LogLevel::info)) {
      fmt::print(stderr, "INFO ||NEURON_PARALLEL_COMPILE||: Report kept in {}\n", name);
    }
  }
}

// The exit status of a compile run: the number of failed graphs, as the Neuron tool
// returns it, kept below 256 so that a shell never sees 0 for a failed run.
inline int failed_exit_status(std::size_t failed) { return static_cast<int>(std::min<std::size_t>(failed, 255)); }

}  // namespace neffcache::tools
