// Definitions of store/metrics.hpp (core/decl.hpp).
#pragma once

#include <neffcache/store/metrics.hpp>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache::store {

NEFFCACHE_DECL const std::vector<MetricSpec>& daemon_metrics() {
  static const std::vector<MetricSpec> specs{
      {"neffcache_hits_total", "counter", "Opens of a model.neff that was done already.", "/hits"},
      {"neffcache_misses_total", "counter",
       "Opens of a model.neff that needed a compile or a fetch, or joined one.", "/misses"},
      {"neffcache_refused_total", "counter", "Misses refused at once because compiles are off.",
       "/refused"},
      {"neffcache_opens_waiting", "gauge", "Opens waiting now for a compile or a fetch.",
       "/waiters"},
      {"neffcache_waits_interrupted_total", "counter",
       "Waiting opens ended by a signal to their process.", "/interrupted"},
      {"neffcache_read_bytes_total", "counter",
       "Bytes served: asked for by reads through the daemon, plus the size of every file opened "
       "with passthrough "
       "(which the kernel reads without the daemon).",
       "/read_bytes"},
      {"neffcache_reads_total", "counter",
       "READ requests the daemon answered (none for a passthrough open).", "/reads"},
      {"neffcache_passthrough_enabled", "gauge",
       "1 when the kernel reads done files without the daemon.", "/passthrough/on"},
      {"neffcache_passthrough_opens_total", "counter", "Opens served by FUSE passthrough.",
       "/passthrough/opens"},
      {"neffcache_passthrough_writers_total", "counter",
       "Opens for writing served by FUSE passthrough (readers were passing through the file).",
       "/passthrough/writers"},
      {"neffcache_passthrough_fallbacks_total", "counter",
       "Opens of done files served by the daemon because the kernel refused to register the "
       "backing file.",
       "/passthrough/fallbacks"},
      {"neffcache_passthrough_busy_total", "counter",
       "Opens of done files served by the daemon because the file had opens the kernel caches.",
       "/passthrough/busy"},
      {"neffcache_compile_slots", "gauge", "Compiles the daemon runs at once at most (--jobs).",
       "/jobs"},
      {"neffcache_compiles_started_total", "counter", "Compiler runs started.",
       "/compiles/started"},
      {"neffcache_compiles_finished_total",
       "counter",
       "Compiler runs finished, by result: succeeded, failed (recorded: the compiler refused the "
       "graph) or "
       "transient (killed, timed out, out of memory, stopped: tried again at the next open).",
       "/compiles",
       "result",
       {"succeeded", "failed", "transient"}},
      {"neffcache_compile_seconds_total", "counter",
       "Wall time of the compiler runs that finished.", "/compiles/seconds"},
      {"neffcache_twins_served_total", "counter",
       "Entries given the result of an equal graph compiled before (the content index) instead of "
       "a compile.",
       "/twins/served"},
      {"neffcache_twin_saved_seconds_total", "counter",
       "The compile time of the results served to twins.", "/twins/seconds_saved"},
      {"neffcache_scheduler_entries",
       "gauge",
       "Entries the scheduler holds now, by state: queued for a compile slot, running, or locked "
       "by another "
       "process.",
       "/entries",
       "state",
       {"queued", "running", "locked"}},
      {"neffcache_entries_finished_total",
       "counter",
       "Entries the scheduler finished, by result: done (with a NEFF) or failed.",
       "/entries",
       "result",
       {"done", "failed"}},
      {"neffcache_eio_total", "counter",
       "Opens answered with EIO, by the numbered site that answered them.", "/eio", "site"},
      {"neffcache_memory_reserved_bytes", "gauge",
       "Memory the daemon's running compiles have reserved.", "/memory/reserved"},
      {"neffcache_memory_host_reserved_bytes", "gauge",
       "Memory every neffcache process on the host has reserved for compiles.",
       "/memory/host_reserved"},
      {"neffcache_memory_budget_bytes", "gauge", "Host memory compiles may reserve (--mem-budget).",
       "/memory/budget"},
      {"neffcache_memory_waiting", "gauge",
       "1 when the next compile waits for memory rather than for a slot.", "/memory/waiting"},
      {"neffcache_oom_kills_total", "counter",
       "Compiles killed for lack of memory, each queued again with a larger reservation.",
       "/memory/oom_kills"},
      {"neffcache_index_scanned_entries", "gauge",
       "Done entries the start-up scan of the content index looked at.", "/index/scan_entries"},
      {"neffcache_index_scan_added_entries", "gauge",
       "Entries the start-up scan added to the content index.", "/index/scan_added"},
      {"neffcache_index_scan_unreadable_entries", "gauge",
       "Entries whose graph the start-up scan could not read.", "/index/scan_unreadable"},
      {"neffcache_index_added_total", "counter",
       "Entries added to the content index when first seen done after the start.",
       "/index/added_on_sight"},
      {"neffcache_s3_fetches_total", "counter",
       "NEFFs fetched from the bucket into the local folder.", "/s3/fetches"},
      {"neffcache_s3_fetched_bytes_total", "counter", "Bytes of the NEFFs fetched from the bucket.",
       "/s3/fetched_bytes"},
      {"neffcache_s3_uploads_total", "counter",
       "Uploads other than results: an entry's inputs (once per entry), each NKI kernel, each file "
       "of a "
       "promoted LNL entry.",
       "/s3/uploads"},
      {"neffcache_s3_published_total", "counter", "Results this host published into the bucket.",
       "/s3/published"},
      {"neffcache_s3_lookups_total", "counter",
       "Listings of the bucket made because the local folder lacked a name, or was listed.",
       "/s3/lookups"},
      {"neffcache_s3_evictions_total", "counter",
       "NEFFs removed from the local folder to keep it under its cap.", "/s3/evictions"},
      {"neffcache_s3_local_neff_bytes", "gauge", "Bytes of the NEFFs the local folder keeps.",
       "/s3/local_neff_bytes"},
      {"neffcache_s3_local_cap_bytes", "gauge",
       "The cap of the local folder's NEFFs (--local-cache-size).", "/s3/local_cap_bytes"},
      {"neffcache_s3_requests_total", "counter", "HTTP requests sent to S3, retries included.",
       "/s3/requests"},
      {"neffcache_s3_request_errors_total", "counter",
       "S3 requests that failed: no answer, or an HTTP error other than 404 Not Found and 412 "
       "Precondition Failed "
       "(which are answers).",
       "/s3/request_errors"},
      {"neffcache_s3_retries_total", "counter", "S3 requests sent again after a transient error.",
       "/s3/retries"},
  };
  return specs;
}

NEFFCACHE_DECL const std::vector<MetricSpec>& cache_metrics() {
  static const std::vector<MetricSpec> specs{
      {"neffcache_cache_entries", "gauge",
       "Entries of the cache by state: pending (a graph without its NEFF), compiling, done, "
       "failed, stale (a lock "
       "nobody holds), empty, partial (a NEFF or marker without the rest: what an interrupted compile, copy or "
       "publish left).",
       "/states", "state"},
      {"neffcache_cache_bytes", "gauge", "Bytes of every entry's files.", "/bytes"},
      {"neffcache_cache_neff_bytes", "gauge", "Bytes of the entries' NEFFs.", "/neff_bytes"},
      {"neffcache_cache_compile_seconds", "gauge",
       "Compile time recorded with the NEFFs the cache holds.", "/stored_compile_seconds"},
      {"neffcache_cache_twins", "gauge", "Entries whose NEFF is an equal graph's result, copied.",
       "/twins"},
      {"neffcache_cache_twin_saved_seconds", "gauge", "The compile time those copies saved.",
       "/twin_seconds_saved"},
      {"neffcache_cache_oom_retries", "gauge",
       "Out-of-memory kills recorded with the cache's entries before they compiled.",
       "/memory/oom_retries"},
  };
  return specs;
}

}  // namespace neffcache::store

namespace neffcache::detail {

// A label value as the text format quotes it: backslash, double quote and newline escaped.
inline std::string prometheus_label_value(std::string_view v) {
  std::string out;
  for (char c : v) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

inline std::string prometheus_labels(const store::MetricLabels& labels) {
  if (labels.empty()) return {};
  std::string out = "{";
  for (std::size_t i = 0; i < labels.size(); ++i)
    out += fmt::format("{}{}=\"{}\"", i ? "," : "", labels[i].first,
                       prometheus_label_value(labels[i].second));
  return out + "}";
}

// A sample's value, or nothing for what is no number (null: a part the daemon lacks).
inline std::optional<std::string> prometheus_value(const nlohmann::json& v) {
  if (v.is_boolean()) return std::string(v.get<bool>() ? "1" : "0");
  if (v.is_number_unsigned()) return fmt::format("{}", v.get<uint64_t>());
  if (v.is_number_integer()) return fmt::format("{}", v.get<int64_t>());
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isnan(d)) return std::string("NaN");
    if (std::isinf(d)) return std::string(d > 0 ? "+Inf" : "-Inf");
    return fmt::format("{}", d);
  }
  return std::nullopt;
}

}  // namespace neffcache::detail

namespace neffcache::store {

NEFFCACHE_DECL std::string prometheus_text(const std::vector<MetricSpec>& specs,
                                           const nlohmann::json& doc, const MetricLabels& labels) {
  std::string out;
  for (const auto& spec : specs) {
    const nlohmann::json::json_pointer ptr{std::string(spec.pointer)};
    if (!doc.contains(ptr)) continue;
    const auto& at = doc.at(ptr);
    std::vector<std::string> samples;
    if (spec.label.empty()) {
      if (auto v = detail::prometheus_value(at))
        samples.push_back(fmt::format("{}{} {}", spec.name, detail::prometheus_labels(labels), *v));
    } else if (at.is_object()) {
      for (const auto& [member, value] : at.items()) {
        if (!spec.members.empty() &&
            std::find(spec.members.begin(), spec.members.end(), member) == spec.members.end())
          continue;
        auto v = detail::prometheus_value(value);
        if (!v) continue;
        MetricLabels mine = labels;
        mine.emplace_back(std::string(spec.label), member);
        samples.push_back(fmt::format("{}{} {}", spec.name, detail::prometheus_labels(mine), *v));
      }
    }
    if (samples.empty()) continue;
    out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", spec.name, spec.help, spec.name, spec.type);
    for (const auto& s : samples) out += s + "\n";
  }
  return out;
}

NEFFCACHE_DECL std::string prometheus_build_info(std::string_view version,
                                                 const MetricLabels& labels) {
  MetricLabels mine = labels;
  mine.emplace_back("version", std::string(version));
  return fmt::format(
      "# HELP neffcache_build_info The version of the program that wrote these metrics.\n"
      "# TYPE neffcache_build_info gauge\nneffcache_build_info{} 1\n",
      detail::prometheus_labels(mine));
}

}  // namespace neffcache::store
