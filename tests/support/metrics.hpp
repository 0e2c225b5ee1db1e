// Prometheus' text format as the tests read it: the TYPE of each metric and the value of each
// sample, and promtool's verdict on a text (Prometheus' own checker).
#pragma once

#include <map>
#include <sstream>
#include <string>

#include "paths.hpp"
#include "support.hpp"

namespace test {

struct Metrics {
  std::map<std::string, std::string> types;  // metric name -> counter, gauge
  std::map<std::string, double> samples;     // `name{labels}` as written -> value
  // The one sample of `name` whose labels include `label` (e.g. result="failed"), or -1.
  double value(const std::string& name, const std::string& label = "") const {
    double found = -1;
    int matches = 0;
    for (const auto& [sample, v] : samples)
      if (sample.starts_with(name + "{") && sample.find(label) != std::string::npos)
        found = v, ++matches;
    return matches == 1 ? found : -1;
  }
};

inline Metrics parse_metrics(const std::string& text) {
  Metrics m;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.starts_with("# TYPE ")) {
      std::istringstream words(line.substr(7));
      std::string name, type;
      words >> name >> type;
      m.types[name] = type;
    } else if (!line.empty() && line[0] != '#') {
      auto space = line.rfind(' ');
      m.samples[line.substr(0, space)] = std::stod(line.substr(space + 1));
    }
  }
  return m;
}

// `promtool check metrics` on `text`: its exit code (0: accepted, lint included) and output.
inline ToolRun promtool_check(const std::string& text, const fs::path& scratch) {
  INFO("promtool is missing (scripts/setup.sh unpacks it into /opt/neffcache/prometheus)");
  REQUIRE(fs::exists(test::path::promtool));
  const fs::path file = scratch / "metrics.prom";
  test::spit(file, text);
  return run(
      {"sh", "-c", fmt::format("'{}' check metrics < '{}'", test::path::promtool, file.string())});
}

}  // namespace test
