// Metrics in Prometheus' text format (store/metrics.hpp): what the text says for a document,
// and that docs/METRICS.md lists exactly the metrics the tables name, with their types.
#include <filesystem>
#include <regex>
#include <set>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/store/metrics.hpp>

#include "metrics.hpp"
#include "support.hpp"

using namespace neffcache;
namespace fs = std::filesystem;

TEST_CASE(
    "metrics: one HELP and TYPE per metric, labelled samples, nothing for what the document lacks",
    "[metrics]") {
  const std::vector<store::MetricSpec> specs{
      {"x_hits_total", "counter", "Hits.", "/hits"},
      {"x_gone", "gauge", "Absent.", "/nothing/here"},
      {"x_null_bytes", "gauge", "Null.", "/budget"},
      {"x_compiles_total", "counter", "By result.", "/compiles", "result", {"succeeded", "failed"}},
      {"x_eio_total", "counter", "By site.", "/eio", "site"},
      {"x_on", "gauge", "A flag.", "/on"},
      {"x_seconds_total", "counter", "Time.", "/seconds"},
  };
  const auto doc = nlohmann::json::parse(R"({"hits": 3, "budget": null, "on": true, "seconds": 1.5,
      "compiles": {"succeeded": 2, "failed": 1, "started": 4}, "eio": {"01": 0, "07": 5}})");
  const std::string text =
      store::prometheus_text(specs, doc, {{"mount", "/var/tmp/a \"b\"\\c\nd"}});
  const auto m = test::parse_metrics(text);
  CHECK(m.types == std::map<std::string, std::string>{{"x_hits_total", "counter"},
                                                      {"x_compiles_total", "counter"},
                                                      {"x_eio_total", "counter"},
                                                      {"x_on", "gauge"},
                                                      {"x_seconds_total", "counter"}});
  const std::string label = R"(mount="/var/tmp/a \"b\"\\c\nd")";
  CHECK(text.find("x_hits_total{" + label + "} 3\n") != std::string::npos);
  CHECK(m.value("x_compiles_total", "result=\"failed\"") == 1);
  CHECK(m.value("x_compiles_total", "result=\"succeeded\"") == 2);
  CHECK(m.value("x_compiles_total", "result=\"started\"") == -1);  // not a member it names
  CHECK(m.value("x_eio_total", "site=\"07\"") == 5);
  CHECK(m.value("x_on") == 1);
  CHECK(m.value("x_seconds_total") == 1.5);
  CHECK(text.find("x_gone") == std::string::npos);
  CHECK(text.find("x_null_bytes") == std::string::npos);
  test::TempDir dir;
  auto checked =
      test::promtool_check(text + store::prometheus_build_info("1.2.3+git4.gabc", {}), dir.path());
  INFO(checked.output);
  CHECK(checked.exit_code == 0);
}

TEST_CASE("metrics: docs/METRICS.md lists every metric with its type, and nothing else",
          "[metrics]") {
  std::set<std::pair<std::string, std::string>> in_code{{"neffcache_build_info", "gauge"}};
  for (const auto* table : {&store::daemon_metrics(), &store::cache_metrics()})
    for (const auto& spec : *table) {
      CHECK(in_code.emplace(std::string(spec.name), std::string(spec.type))
                .second);  // one place each
      // Prometheus' conventions: counters end in _total; units are base units.
      CHECK((spec.type == "counter") == std::string_view(spec.name).ends_with("_total"));
      CHECK(std::string_view(spec.name).find("_ms") == std::string_view::npos);
    }
  std::set<std::pair<std::string, std::string>> in_docs;
  const std::regex row(R"(^\| `(neffcache_[a-z0-9_]+)` \| (counter|gauge) \|)");
  std::istringstream doc(test::slurp(fs::path(test::path::docs) / "METRICS.md"));
  for (std::string line; std::getline(doc, line);)
    if (std::smatch m; std::regex_search(line, m, row)) CHECK(in_docs.emplace(m[1], m[2]).second);
  CHECK(in_docs == in_code);
}
