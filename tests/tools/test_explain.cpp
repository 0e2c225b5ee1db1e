// neffcache explain, run as a user runs it on a cache that `neffcache compile` filled with
// the fake compiler: each verdict (hit, twin, failure, miss) and what a miss names.
#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/hlo/hlo.hpp>

#include "support.hpp"

using namespace neffcache;
namespace fs = std::filesystem;

namespace {

using test::k_fake_template;

// Runs the explain_tool with a clean Neuron environment plus `env` (NAME=value words).
test::ToolRun explain_tool(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  return test::run_tool(args, env);
}

// `bytes` with every `from` replaced by `to` of the same length.
std::string explain_replace_all(std::string bytes, std::string_view from, std::string_view to) {
  REQUIRE(from.size() == to.size());
  auto at = bytes.find(from);
  REQUIRE(at != std::string::npos);
  for (; at != std::string::npos; at = bytes.find(from, at + to.size())) bytes.replace(at, from.size(), to);
  return bytes;
}

std::string sha256_of(const std::string& bytes) {
  auto a = analyze_hlo(bytes);
  REQUIRE(a.has_value());
  return a->canonical_sha256;
}

bool contains(const std::string& text, std::string_view part) { return text.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("neffcache explain: hit, twin, failure, and what a miss differs in", "[cli][explain]") {
  test::TempDir dir;
  const auto cache = dir / "cache";
  const std::string x_squared = (test::k_corpus / "gopjrt_x_squared.hlo.pb").string();
  const std::string tuple = (test::k_corpus / "gopjrt_tuple.hlo.pb").string();
  auto put = [&](const std::string& hlo) {
    auto r = explain_tool({"put", "--cache", cache.string(), "--compiler-version", "2.21.0", hlo});
    REQUIRE(r.exit_code == 0);
    return fs::path(r.output.substr(0, r.output.size() - 1));
  };
  const fs::path done = put(x_squared), failed = put(tuple);
  // The tuple graph fails, deterministically: a recorded failure.
  const std::string bad = failed.filename().string().substr(7, 20);
  auto compiled = explain_tool({"compile", "--cache", cache.string(), "--compiler", k_fake_template},
                {"NEFFCACHE_FAKE_FAIL=1", "NEFFCACHE_FAKE_ONLY=" + bad});
  CHECK(compiled.exit_code == 1);  // one graph failed
  REQUIRE(fs::exists(done / "model.done"));
  REQUIRE(fs::exists(failed / "model.log"));
  auto explain = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"explain", "--cache", cache.string()});
    return explain_tool(args);
  };

  SECTION("the graph's own entry is done: a hit") {
    auto r = explain({"--compiler-version", "2.21.0", x_squared});
    CHECK(r.exit_code == 0);
    CHECK(r.output.rfind("hit: " + done.string() + " is compiled\n", 0) == 0);
    auto j = nlohmann::json::parse(explain({"--compiler-version", "2.21.0", "--json", x_squared}).output);
    CHECK(j["verdict"] == "hit");
    CHECK(j["entry"] == done.string());
    CHECK(j["identity"] == "neuronxcc-2.21.0/" + sha256_of(test::slurp(x_squared)) + "+d7517139");
    CHECK(j["nearest"].empty());
  }

  SECTION("an entry of the same graph with other debug metadata: a twin, named") {
    const std::string bytes = test::slurp(x_squared);
    const std::string variant = explain_replace_all(bytes, "x*x.3", "a+b.7");  // names only
    REQUIRE(variant != bytes);
    REQUIRE(sha256_of(variant) == sha256_of(bytes));
    const fs::path twin = cache / "neuronxcc-2.21.0/MODULE_00000000000000000001+d7517139";
    test::spit(twin / "model.hlo_module.pb", variant);
    fs::copy_file(done / "compile_flags.json", twin / "compile_flags.json");
    auto r = explain({twin.string()});
    CHECK(r.exit_code == 0);
    CHECK(r.output.rfind("twin: " + twin.string() + " is not compiled, but " + done.string() + " holds the same", 0) ==
          0);
    CHECK(contains(r.output, "s of compiling"));
    auto j = nlohmann::json::parse(explain({"--json", (twin / "model.hlo_module.pb").string()}).output);
    CHECK(j["verdict"] == "twin");
    CHECK(j["entry"] == twin.string());
    CHECK(j["twin"]["entry"] == done.string());
    CHECK(j["twin"]["compile_seconds"].is_number());
  }

  SECTION("an entry of a graph that failed before: a failure, named") {
    const fs::path copy = cache / "neuronxcc-2.21.0/MODULE_00000000000000000002+d7517139";
    test::spit(copy / "model.hlo_module.pb", test::slurp(failed / "model.hlo_module.pb"));
    auto r = explain({copy.string()});
    CHECK(r.exit_code == 0);
    CHECK(r.output.rfind("failure: would fail: same graph as " + failed.string() + ", which failed", 0) == 0);
    CHECK(nlohmann::json::parse(explain({"--json", copy.string()}).output)["verdict"] == "failure");
  }

  SECTION("another flag: a miss whose nearest entry differs in flags") {
    auto r = explain({"--compiler-version", "2.21.0", "--flag=-O1", x_squared});
    CHECK(r.exit_code == 0);
    CHECK(r.output.rfind("miss: ", 0) == 0);
    CHECK(contains(r.output, "  " + done.string() + " (done)\n    same graph, other flags: added -O1; removed none\n"));
    auto j = nlohmann::json::parse(explain({"--compiler-version", "2.21.0", "--flag=-O1", "--json", x_squared}).output);
    CHECK(j["verdict"] == "miss");
    CHECK(j["twin"].is_null());
    REQUIRE(!j["nearest"].empty());
    CHECK(j["nearest"][0]["entry"] == done.string());
    CHECK(j["nearest"][0]["differs"] == "flags");
    CHECK(j["nearest"][0]["flags_added"] == nlohmann::json::array({"-O1"}));
    CHECK(j["nearest"][0]["flags_removed"].empty());
  }

  SECTION("another compiler version: the nearest entry differs in compiler") {
    auto j = nlohmann::json::parse(explain({"--compiler-version", "2.22.0", "--json", x_squared}).output);
    CHECK(j["verdict"] == "miss");
    REQUIRE(!j["nearest"].empty());
    CHECK(j["nearest"][0]["differs"] == "compiler");
    CHECK(j["nearest"][0]["compiler"] == "neuronxcc-2.21.0");
  }

  SECTION("one changed opcode: the nearest graph differs in one instruction") {
    const std::string bytes = test::slurp(x_squared);
    const std::string edited = explain_replace_all(bytes, "\x08multiply", "\x08subtract");
    REQUIRE(sha256_of(edited) != sha256_of(bytes));
    test::spit(dir / "subtract.pb", edited);
    auto r = explain({"--compiler-version", "2.21.0", (dir / "subtract.pb").string()});
    CHECK(r.exit_code == 0);
    CHECK(r.output.rfind("miss: ", 0) == 0);
    CHECK(contains(r.output, "  " + done.string() +
                                 " (done)\n    graph differs: 0 instructions added, 0 removed, 1 changed\n"
                                 "      cached: instructions { opcode \"multiply\""));
    CHECK(contains(r.output, "      asked:  instructions { opcode \"subtract\""));
    auto j = nlohmann::json::parse(
        explain({"--compiler-version", "2.21.0", "--json", (dir / "subtract.pb").string()}).output);
    REQUIRE(!j["nearest"].empty());
    CHECK(j["nearest"][0]["differs"] == "graph");
    CHECK(j["nearest"][0]["instructions"] == nlohmann::json{{"added", 0}, {"removed", 0}, {"changed", 1}});
    CHECK(contains(j["nearest"][0]["first_difference"]["cached"].get<std::string>(), "multiply"));
  }

  SECTION("bad input: one line, exit 1; a bad command line: exit 2") {
    test::spit(dir / "junk.pb", "this is not a protobuf \xff\xff");
    test::check_one_line_error(explain({"--compiler-version", "2.21.0", (dir / "junk.pb").string()}), "junk.pb");
    test::check_one_line_error(explain({"--compiler-version", "2.21.0", (dir / "missing.pb").string()}), "missing.pb");
    test::check_one_line_error(explain({(cache / "neuronxcc-2.21.0").string()}), "not a cache entry");
    CHECK(explain_tool({"explain", "--cache", cache.string()}).exit_code == 2);
  }
}
