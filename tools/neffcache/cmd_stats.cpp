// neffcache stats: the daemon's counters when the cache is a neffcachefs mount, and the
// cache's own figures (entries by state, sizes, compile time stored) always.
#include "neffcache/cmd_stats.hpp"

#include <algorithm>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <neffcache/core/file.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/core/size.hpp>
#include <neffcache/store/metrics.hpp>

#include "common/version.hpp"
#include "neffcache/common.hpp"

namespace neffcache::cli {

void setup_stats(CLI::App& app, int& exit_code) {
  auto [sub, opts] = add_cache_command(
      app, exit_code, "stats",
      "Entries by state, sizes and stored compile time; on a neffcachefs mount, the daemon's counters too", run_stats);
  sub->add_option("--format", opts->format,
                  "text, json, or prometheus (Prometheus' text format: the cache's figures and, on a mount, the "
                  "daemon's metrics, as neffcachefs --metrics-file writes them)")
      ->check(CLI::IsMember({"text", "json", "prometheus"}))
      ->capture_default_str();
  sub->add_flag_callback("--json", [o = opts] { o->format = "json"; }, "print JSON (--format json)");
}

int run_stats(const StatsOptions& opts) {
  auto listed = open_listed(opts.cache);
  if (!listed) return report(listed.error());
  const auto& [cache, entries] = *listed;
  StateCounts c;
  uint64_t bytes = 0, neff_bytes = 0;
  double compile_seconds = 0, saved_seconds = 0;
  std::size_t twins = 0, lnl = 0;
  // Memory: compiles whose peak is recorded, the largest peak, how the predictions
  // compared (reservation / peak), and the out-of-memory kills before they succeeded.
  std::vector<double> prediction_ratios;
  uint64_t largest_peak_kib = 0;
  std::size_t peaks = 0, oom_retries = 0;
  for (const auto& e : entries) {
    if (e.peak_kib) {
      ++peaks;
      largest_peak_kib = std::max(largest_peak_kib, e.peak_kib);
      if (e.predicted_peak_kib)
        prediction_ratios.push_back(static_cast<double>(e.predicted_peak_kib) / static_cast<double>(e.peak_kib));
    }
    oom_retries += static_cast<std::size_t>(e.oom_retries);
    if (e.copied_from) ++twins, saved_seconds += e.saved_seconds;
    ++c.of(e.state);
    if (e.files.is_lnl()) ++lnl;
    bytes += e.bytes;
    neff_bytes += e.neff_bytes;
    compile_seconds += e.compile_seconds.value_or(0);
  }
  nlohmann::ordered_json j{{"cache", cache->name()},
                           {"entries", c.total()},
                           {"states",
                            {{"pending", c.pending},
                             {"compiling", c.compiling},
                             {"done", c.done},
                             {"failed", c.failed},
                             {"stale", c.stale},
                             {"empty", c.empty},
                             {"partial", c.partial}}},
                           {"dialects", {{"neuron", c.total() - lnl}, {"lnl", lnl}}},
                           {"bytes", bytes},
                           {"neff_bytes", neff_bytes},
                           {"stored_compile_seconds", compile_seconds},
                           {"twins", twins},
                           {"twin_seconds_saved", saved_seconds}};
  std::sort(prediction_ratios.begin(), prediction_ratios.end());
  auto ratio_at = [&](double q) -> nlohmann::ordered_json {
    if (prediction_ratios.empty()) return nullptr;
    return prediction_ratios[static_cast<std::size_t>(q * static_cast<double>(prediction_ratios.size() - 1))];
  };
  j["memory"] = {{"peaks_recorded", peaks},
                 {"largest_peak_kib", largest_peak_kib},
                 {"predicted_over_peak", {{"min", ratio_at(0)}, {"median", ratio_at(0.5)}, {"max", ratio_at(1)}}},
                 {"oom_retries", oom_retries}};
  if (auto text = cache->daemon_stats()) j["daemon"] = nlohmann::ordered_json::parse(*text, nullptr, false);
  if (opts.format == "json") {
    fmt::print("{}\n", j.dump(2));
    return k_exit_ok;
  }
  if (opts.format == "prometheus") {
    fmt::print("{}", store::prometheus_build_info(program_version(), {{"cache", cache->name()}}));
    fmt::print("{}", store::prometheus_text(store::cache_metrics(), j, {{"cache", cache->name()}}));
    // The daemon's, labelled as its --metrics-file labels them: by the mount.
    if (j.contains("daemon") && j["daemon"].is_object())
      fmt::print("{}", store::prometheus_text(store::daemon_metrics(), j["daemon"],
                                              {{"mount", j["daemon"].value("mount", cache->name())}}));
    return k_exit_ok;
  }
  fmt::print("cache                   {}\n", cache->name());
  // (Partial: a product without the rest, what an interrupted compile, copy or publish
  // left; compiled again like a pending one.)
  fmt::print("entries                 {} ({} pending, {} compiling, {} done, {} failed, {} stale locks, {} partial)\n",
             c.total(), c.pending, c.compiling, c.done, c.failed, c.stale, c.partial);
  if (lnl > 0) fmt::print("dialects                {} Neuron, {} LNL (vLLM Neuron, TorchNeuron)\n", c.total() - lnl, lnl);
  fmt::print("size                    {} ({} in NEFFs)\n", format_size(bytes), format_size(neff_bytes));
  // What every hit saves: the compile time stored with each NEFF we compiled.
  fmt::print("compile time stored     {:.1f} s\n", compile_seconds);
  // Entries given an equal graph's result instead of a compile (the content index).
  fmt::print("twins                   {} entries, {:.1f} s of compiles saved\n", twins, saved_seconds);
  fmt::print("memory peaks            {} recorded, largest {}", peaks, format_size(largest_peak_kib << 10));
  if (!prediction_ratios.empty())
    fmt::print("; reserved / peak {:.2f} median ({:.2f} to {:.2f})", ratio_at(0.5).get<double>(),
               prediction_ratios.front(), prediction_ratios.back());
  fmt::print("; {} out-of-memory kill{} retried\n", oom_retries, oom_retries == 1 ? "" : "s");
  if (j.contains("daemon") && j["daemon"].is_object()) {
    const auto& d = j["daemon"];
    fmt::print("daemon (neffcachefs)    {} hits, {} misses, {} waiting now, {} interrupted, {} read\n",
               d.value("hits", 0), d.value("misses", 0), d.value("waiters", 0), d.value("interrupted", 0),
               format_size(d.value("read_bytes", uint64_t{0})));
    if (d.contains("compiles"))
      fmt::print("daemon compiles         {} started, {} succeeded, {} failed, {} transient, {:.1f} s\n",
                 d["compiles"].value("started", 0), d["compiles"].value("succeeded", 0),
                 d["compiles"].value("failed", 0), d["compiles"].value("transient", 0),
                 d["compiles"].value("seconds", 0.0));
    if (d.contains("twins"))
      fmt::print("daemon twins            {} served, {:.1f} s of compiles saved\n", d["twins"].value("served", 0),
                 d["twins"].value("seconds_saved", 0.0));
    if (d.contains("memory") && d["memory"].is_object() && d["memory"]["budget"].is_number())
      fmt::print("daemon memory           {} reserved here, {} on the host, budget {}; {} out-of-memory kills\n",
                 format_size(d["memory"].value("reserved", uint64_t{0})),
                 format_size(d["memory"].value("host_reserved", uint64_t{0})),
                 format_size(d["memory"].value("budget", uint64_t{0})), d["memory"].value("oom_kills", 0));
  }
  return k_exit_ok;
}

}  // namespace neffcache::cli
