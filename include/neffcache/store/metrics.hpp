// Metrics in Prometheus' text format, for an operator's monitoring: what a daemon's
// stats.json holds (neffcachefs --metrics-file writes it; `neffcache stats --format
// prometheus` prints it with the cache's own figures). One table per document names every
// metric, its type, its meaning and where its value is in the document; the documented list
// (docs/METRICS.md) is checked against these tables by a test, so that a metric is
// described in one place each.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <neffcache/core/decl.hpp>

namespace neffcache::store {

struct MetricSpec {
  std::string_view name;  // neffcache_..., with Prometheus' suffixes (_total, _seconds, _bytes)
  std::string_view type;  // "counter" or "gauge"
  std::string_view help;
  std::string_view pointer;  // a JSON pointer into the document: the value, or an object of them
  // For an object: the label its members' names go into, and which members (all when empty).
  std::string_view label = {};
  std::vector<std::string_view> members = {};
};

// The daemon's document (stats.json). Metrics of parts a mount lacks (S3 over a folder, a
// memory budget when compiles are admitted by count) are left out of the text.
NEFFCACHE_DECL const std::vector<MetricSpec>& daemon_metrics();
// The document of `neffcache stats --json` without its "daemon" member: the cache's entries.
NEFFCACHE_DECL const std::vector<MetricSpec>& cache_metrics();

using MetricLabels = std::vector<std::pair<std::string, std::string>>;

// The metrics of `specs` found in `doc`, each sample with `labels` (e.g. {"mount", path}),
// in Prometheus' text exposition format 0.0.4: a HELP and a TYPE line per metric.
NEFFCACHE_DECL std::string prometheus_text(const std::vector<MetricSpec>& specs,
                                           const nlohmann::json& doc, const MetricLabels& labels);

// One constant sample naming the version of the program that wrote the text:
// neffcache_build_info{version="..."} 1.
NEFFCACHE_DECL std::string prometheus_build_info(std::string_view version,
                                                 const MetricLabels& labels);

}  // namespace neffcache::store

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/store/metrics.ipp>
#endif
