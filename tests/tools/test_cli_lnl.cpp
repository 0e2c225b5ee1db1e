// The neffcache commands on a directory cache that holds both dialects: Neuron entries
// (neuronxcc-*/MODULE_*) and LNL ones (vLLM Neuron, TorchNeuron: <root>/<key>/), with the
// lock files and nki/ folder LNL keeps in the root. Run as a user runs them.
#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cctype>
#include <map>

#include <catch2/catch_test_macros.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/record.hpp>

#include "fake_neuronx_cc/fake_neff.hpp"
#include "lnl.hpp"
#include "support.hpp"

using namespace neffcache;
namespace fs = std::filesystem;

namespace {

using test::k_fake_template;

test::ToolRun lnl_tool(const std::vector<std::string>& args, const std::vector<std::string>& env = {}) {
  return test::run_tool(args, env);
}

// The JSON document that ends a run's output (see test_cli_cache.cpp).
nlohmann::json lnl_last_json(const std::string& output) {
  auto begin = output.rfind('{', 0) == 0 ? 0 : output.find("\n{") + 1;
  auto end = output.rfind("\n}");
  REQUIRE(end != std::string::npos);
  return nlohmann::json::parse(output.substr(begin, end + 2 - begin));
}

// A root with a pending Neuron entry and LNL entries in every state a client leaves:
// pending, partial (an interrupted compile), done (LNL published it), failed (our record);
// beside them LNL's lock files and its NKI folder.
struct MixedCache {
  test::TempDir dir;
  fs::path root = dir / "cache";
  fs::path neuron;
  std::string pending = test::lnl_key("pending"), partial = test::lnl_key("partial"), done = test::lnl_key("done"),
              failed = test::lnl_key("failed");

  MixedCache() {
    auto r = lnl_tool({"put", "--cache", root.string(), "--compiler-version", "2.21.0",
                   (test::k_corpus / "gopjrt_tuple.hlo.pb").string()});
    REQUIRE(r.exit_code == 0);
    neuron = r.output.substr(0, r.output.size() - 1);
    test::make_lnl_entry(root, "gopjrt_x_squared.hlo.pb", pending, {"--model-type", "transformer", "-O1"});
    // Another target than the template's: its own command must be what runs.
    test::make_lnl_entry(root, "rocm08_normal_9.hlo_proto.pb", partial);
    test::spit(root / partial / "command.txt", test::lnl_command_text(partial, {"-O2"}, "trn2"));
    test::spit(root / partial / lnl_neff_name(partial), "the first half of a NEFF");
    test::spit(root / partial / "log-neuron-cc.txt", "killed\n");
    test::make_lnl_entry(root, "spu_credit_fraud_predict.hlo.pb", done);
    test::spit(root / done / lnl_neff_name(done), std::string(3000, 'n'));
    test::spit(root / done / ".compilation_complete", lnl_marker(1700000000, 3000));
    test::make_lnl_entry(root, "spu_jax_cnn.hlo.pb", failed);
    test::spit(root / failed / ".neffcache-failed.log", "ERROR: it did not work\n");
    for (const auto& key : {pending, done}) test::spit(test::lnl_lock(root, key), "");  // left behind by clients
    fs::create_directories(root / "nki");
    test::spit(root / "nki" / (test::lnl_key("kernel") + ".json"), "{}\n");
  }

  std::string neuron_path() const { return fs::relative(neuron, root).string(); }
  std::map<std::string, nlohmann::json> ls() const {
    auto r = lnl_tool({"ls", "--cache", root.string(), "--json"});
    REQUIRE(r.exit_code == 0);
    std::map<std::string, nlohmann::json> by_path;
    for (auto& e : nlohmann::json::parse(r.output)) by_path[e["path"]] = e;
    return by_path;
  }
  // LNL's own files beside the entries, which no command may take.
  void check_lnl_root_files() const {
    CHECK(fs::exists(test::lnl_lock(root, pending)));
    CHECK(fs::exists(test::lnl_lock(root, done)));
    CHECK(fs::exists(root / "nki" / (test::lnl_key("kernel") + ".json")));
  }
};

}  // namespace

TEST_CASE("neffcache ls, scan and stats show both dialects and LNL's states", "[cli][lnl]") {
  MixedCache c;
  auto by_path = c.ls();
  REQUIRE(by_path.size() == 5);
  CHECK(by_path[c.neuron_path()]["dialect"] == "neuron");
  CHECK(by_path[c.neuron_path()]["state"] == "pending");
  const std::map<std::string, std::string> lnl_states{
      {c.pending, "pending"}, {c.partial, "partial"}, {c.done, "done"}, {c.failed, "failed"}};
  for (const auto& [key, state] : lnl_states) {
    INFO(key);
    CHECK(by_path[key]["dialect"] == "lnl");
    CHECK(by_path[key]["state"] == state);
  }
  CHECK(by_path[c.done]["neff_bytes"] == 3000);  // its NEFF is graph_<key>.neff
  CHECK(by_path[c.pending]["bytes"].get<uint64_t>() > fs::file_size(c.root / c.pending / "graph.hlo"));

  auto r = lnl_tool({"ls", "--cache", c.root.string(), "--state", "partial", "--json"});
  REQUIRE(r.exit_code == 0);
  auto partial = nlohmann::json::parse(r.output);
  REQUIRE(partial.size() == 1);
  CHECK(partial[0]["path"] == c.partial);
  r = lnl_tool({"ls", "--cache", c.root.string()});
  REQUIRE(r.exit_code == 0);
  CHECK(std::count(r.output.begin(), r.output.end(), '\n') == 6);  // a header and five entries
  CHECK(r.output.find("partial") != std::string::npos);
  CHECK(r.output.find(" " + c.failed + "\n") != std::string::npos);  // an LNL entry's path is its key

  r = lnl_tool({"scan", "--cache", c.root.string(), "--json"});
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.output);
  CHECK(j["remaining"] == 3);  // the Neuron entry, LNL's pending and partial ones
  CHECK(j["failed"] == 1);
  CHECK(j["done"] == 1);
  CHECK(j["total"] == 5);
  CHECK(j["lnl_entries"] == 4);
  CHECK(j["states"]["partial"] == 1);
  CHECK(j["compiler_dirs"] == std::vector<std::string>{"neuronxcc-2.21.0"});  // no key is a compiler folder
  r = lnl_tool({"scan", "--cache", c.root.string()});
  CHECK(r.output.find("Current remaining items are 3, locked are 0, failed are 1, done are 1, total is 5\n") !=
        std::string::npos);
  CHECK(r.output.find("and 4 LNL entries") != std::string::npos);
  CHECK(r.output.find("Of the remaining items 1 are partial") != std::string::npos);

  r = lnl_tool({"stats", "--cache", c.root.string(), "--json"});
  REQUIRE(r.exit_code == 0);
  j = nlohmann::json::parse(r.output);
  CHECK(j["entries"] == 5);
  CHECK(j["states"]["partial"] == 1);
  CHECK(j["states"]["pending"] == 2);
  CHECK(j["dialects"]["lnl"] == 4);
  CHECK(j["dialects"]["neuron"] == 1);
  CHECK(j["neff_bytes"] == 3000 + std::string("the first half of a NEFF").size());
  r = lnl_tool({"stats", "--cache", c.root.string()});
  CHECK(r.output.find("5 (2 pending, 0 compiling, 1 done, 1 failed, 0 stale locks, 1 partial)") != std::string::npos);
  CHECK(r.output.find("1 Neuron, 4 LNL") != std::string::npos);

  SECTION("a client's held flock makes its entry compiling, and clear-locks leaves it alone") {
    int fd = ::open(test::lnl_lock(c.root, c.pending).c_str(), O_RDWR);
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    CHECK(c.ls()[c.pending]["state"] == "compiling");
    r = lnl_tool({"clear-locks", "--cache", c.root.string()});
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("0 stale locks removed, 0 live locks left alone") != std::string::npos);
    ::close(fd);
    CHECK(c.ls()[c.pending]["state"] == "pending");
    c.check_lnl_root_files();
  }
}

TEST_CASE("neffcache compile and retry compile LNL entries with their own arguments and LNL's marker", "[cli][lnl]") {
  MixedCache c;
  const auto log = c.dir / "compiles.log";
  const std::vector<std::string> env{"NEFFCACHE_FAKE_LOG=" + log.string()};
  auto r = lnl_tool({"compile", "--cache", c.root.string(), "-j", "2", "--compiler", k_fake_template, "--json"}, env);
  CHECK(r.exit_code == 0);
  auto report = lnl_last_json(r.output);
  CHECK(report["compilation_summary"]["true"] == 3);
  CHECK_FALSE(report["compilation_summary"].contains("false"));
  CHECK(report["compilation_report"].contains((c.root / c.pending / "graph.hlo").string()));
  CHECK(report["compilation_report"].contains((c.root / c.partial / "graph.hlo").string()));
  CHECK(test::count_lines(log) == 3);

  // Each with its command.txt's arguments and target, not the template's.
  auto neff = fake::parse_fake_neff(test::slurp(c.root / c.pending / lnl_neff_name(c.pending)));
  REQUIRE(neff.has_value());
  CHECK(neff->flags == R"(["--target=trn1", "--model-type=transformer", "-O1"])");
  neff = fake::parse_fake_neff(test::slurp(c.root / c.partial / lnl_neff_name(c.partial)));
  REQUIRE(neff.has_value());
  CHECK(neff->flags == R"(["--target=trn2", "-O2"])");
  CHECK(test::slurp(c.root / c.partial / "log-neuron-cc.txt").find("killed") == std::string::npos);
  for (const auto& key : {c.pending, c.partial}) {
    auto marker = test::slurp(c.root / key / ".compilation_complete");
    CHECK(marker.starts_with("completed:"));
    CHECK(lnl_marker_neff_size(marker) == fs::file_size(c.root / key / lnl_neff_name(key)));
    CHECK_FALSE(fs::exists(c.root / key / "model.neff"));
  }
  CHECK(fs::exists(c.neuron / "model.done"));
  // The failure stays recorded; LNL's done entry is untouched.
  CHECK(fs::exists(c.root / c.failed / ".neffcache-failed.log"));
  CHECK(test::slurp(c.root / c.done / lnl_neff_name(c.done)) == std::string(3000, 'n'));
  c.check_lnl_root_files();

  // retry forgets the failure of an entry named by its key (relative to the cache)...
  r = lnl_tool({"retry", "--cache", c.root.string(), c.failed});
  CHECK(r.exit_code == 0);
  CHECK(r.output.find((c.root / c.failed).string()) != std::string::npos);
  CHECK_FALSE(fs::exists(c.root / c.failed / ".neffcache-failed.log"));
  CHECK(c.ls()[c.failed]["state"] == "pending");
  // ...and the next run compiles it, it alone.
  r = lnl_tool({"compile", "--cache", c.root.string(), "--compiler", k_fake_template}, env);
  CHECK(r.exit_code == 0);
  CHECK(test::count_lines(log) == 4);
  CHECK(fs::exists(c.root / c.failed / ".compilation_complete"));
  for (const auto& [path, e] : c.ls()) CHECK(e["state"] == "done");

  SECTION("compile --retry-failed and a named LNL entry (a file in it) compile a failure again") {
    const std::string key = test::lnl_key("failed again");
    test::make_lnl_entry(c.root, "gopjrt_tuple.hlo.pb", key);
    test::spit(c.root / key / ".neffcache-failed.log", "ERROR\n");
    r = lnl_tool({"compile", "--cache", c.root.string(), "--compiler", k_fake_template, (c.root / key / "graph.hlo").string()},
             env);
    CHECK(r.exit_code == 1);  // a recorded failure is the answer without --retry-failed
    CHECK(test::count_lines(log) == 4);
    r = lnl_tool({"compile", "--cache", c.root.string(), "--compiler", k_fake_template, "--retry-failed", key}, env);
    CHECK(r.exit_code == 0);
    CHECK(test::count_lines(log) == 5);
    CHECK(c.ls()[key]["state"] == "done");
  }
}

TEST_CASE("neffcache verify checks an LNL NEFF against its marker, and --repair makes it pending", "[cli][lnl]") {
  MixedCache c;
  REQUIRE(lnl_tool({"compile", "--cache", c.root.string(), "--compiler", k_fake_template}).exit_code == 0);
  auto r = lnl_tool({"verify", "--cache", c.root.string()});
  CHECK(r.exit_code == 0);
  // LNL published `done` with no record of ours: its marker's size is the record.
  CHECK(r.output.find("4 checked, 0 broken, 0 repaired, 0 without a record") != std::string::npos);

  const auto neff = c.root / c.pending / lnl_neff_name(c.pending);
  const auto size = fs::file_size(neff);
  fs::resize_file(neff, size / 2);  // cut, as a full disk or a killed copy leaves it
  fs::resize_file(c.root / c.done / lnl_neff_name(c.done), 100);
  r = lnl_tool({"verify", "--cache", c.root.string()});
  CHECK(r.exit_code == 1);
  CHECK(r.output.find(fmt::format("broken {}: {} has {} bytes, its .compilation_complete says {}\n", c.pending,
                                  lnl_neff_name(c.pending), size / 2, size)) != std::string::npos);
  CHECK(r.output.find(fmt::format("broken {}: ", c.done)) != std::string::npos);
  r = lnl_tool({"verify", "--cache", c.root.string(), "--repair"});
  CHECK(r.exit_code == 0);
  CHECK_FALSE(fs::exists(neff));
  CHECK_FALSE(fs::exists(c.root / c.pending / ".compilation_complete"));
  CHECK(fs::exists(c.root / c.pending / "command.txt"));
  auto by_path = c.ls();
  CHECK(by_path[c.pending]["state"] == "pending");
  CHECK(by_path[c.done]["state"] == "pending");
  CHECK(by_path[c.partial]["state"] == "done");
  c.check_lnl_root_files();
}

TEST_CASE("neffcache clear-neffs, gc and clean take LNL entries and leave LNL's lock files and nki/ alone",
          "[cli][lnl]") {
  MixedCache c;
  SECTION("clear-neffs: done and failed LNL entries are pending again") {
    auto r = lnl_tool({"clear-neffs", "--cache", c.root.string()});
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("2 entries are pending again, 0 left alone") != std::string::npos);
    CHECK_FALSE(fs::exists(c.root / c.done / lnl_neff_name(c.done)));
    CHECK_FALSE(fs::exists(c.root / c.done / ".compilation_complete"));
    CHECK_FALSE(fs::exists(c.root / c.failed / ".neffcache-failed.log"));
    CHECK(fs::exists(c.root / c.done / "graph.hlo"));
    auto by_path = c.ls();
    CHECK(by_path[c.done]["state"] == "pending");
    CHECK(by_path[c.failed]["state"] == "pending");
    CHECK(by_path[c.partial]["state"] == "partial");  // not a result: compile takes it
    c.check_lnl_root_files();
  }
  SECTION("gc --keep-compilers drops old compilers' trees, never an LNL entry") {
    auto r = lnl_tool({"put", "--cache", c.root.string(), "--compiler-version", "2.22.0",
                   (test::k_corpus / "gopjrt_x_squared.hlo.pb").string()});
    REQUIRE(r.exit_code == 0);
    r = lnl_tool({"gc", "--cache", c.root.string(), "--max-size", "1T", "--keep-compilers", "1"});
    CHECK(r.exit_code == 0);
    CHECK(c.ls().size() == 5);  // one Neuron tree went; the four LNL entries stayed
    CHECK(fs::exists(c.root / c.done / lnl_neff_name(c.done)));
    // By size, LNL's done entry goes as any done entry would.
    r = lnl_tool({"gc", "--cache", c.root.string(), "--max-size", "0"});
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("removed " + c.done + " ") != std::string::npos);
    CHECK_FALSE(fs::exists(c.root / c.done));
    c.check_lnl_root_files();
  }
  SECTION("clean removes every entry of both dialects, but not the root or LNL's files in it") {
    int fd = ::open(test::lnl_lock(c.root, c.pending).c_str(), O_RDWR);  // a client compiles it
    REQUIRE(fd >= 0);
    REQUIRE(::flock(fd, LOCK_EX) == 0);
    auto r = lnl_tool({"clean", "--cache", c.root.string(), "--yes"});
    ::close(fd);
    CHECK(r.exit_code == 0);
    CHECK(r.output.find("4 entries removed") != std::string::npos);
    CHECK(r.output.find("1 left alone") != std::string::npos);
    CHECK(fs::exists(c.root / c.pending / "graph.hlo"));
    for (const auto& key : {c.partial, c.done, c.failed}) CHECK_FALSE(fs::exists(c.root / key));
    CHECK_FALSE(fs::exists(c.root / "neuronxcc-2.21.0"));
    r = lnl_tool({"clean", "--cache", c.root.string(), "--yes"});
    CHECK(r.exit_code == 0);
    CHECK(c.ls().empty());
    CHECK(fs::is_directory(c.root));
    c.check_lnl_root_files();
  }
}

TEST_CASE("a bad LNL name is a one-line error; explain and analyze read an LNL entry", "[cli][lnl]") {
  MixedCache c;
  const std::string missing = test::lnl_key("nothing");
  for (const auto& cmd : {"compile", "retry", "analyze"}) {
    INFO(cmd);
    std::vector<std::string> args{cmd, "--cache", c.root.string(), missing};
    if (std::string(cmd) == "compile") args.insert(args.end(), {"--compiler", k_fake_template});
    if (std::string(cmd) == "analyze") args.insert(args.end(), {"--output", (c.dir / "out").string()});
    test::check_one_line_error(lnl_tool(args), "not a cache entry (a MODULE_* folder, or an LNL entry's");
  }
  // Upper-case hex is no LNL key; nor is a key folder inside a compiler folder.
  std::string upper = c.pending;
  for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  fs::create_directories(c.root / upper);
  test::check_one_line_error(lnl_tool({"retry", "--cache", c.root.string(), upper}), "not a cache entry");
  fs::create_directories(c.root / "neuronxcc-2.21.0" / missing);
  test::check_one_line_error(lnl_tool({"retry", "--cache", c.root.string(), "neuronxcc-2.21.0/" + missing}),
                             "not an entry of the cache");

  // explain: an entry its client compiled names no compiler version, so it has no identity;
  // a pending one is explained as the compiler that would compile it here sees it.
  test::check_one_line_error(lnl_tool({"explain", "--cache", c.root.string(), (c.root / c.done / "graph.hlo").string()}),
                             "its client compiled it, and nothing says with which compiler version");
  test::check_one_line_error(lnl_tool({"explain", "--cache", c.root.string(), c.pending, "--compiler", "no-such-compiler"}),
                             "cannot tell the compiler version");
  auto explained = lnl_tool({"explain", "--cache", c.root.string(), c.pending, "--compiler", test::path::fake_compiler, "--json"});
  INFO(explained.output);
  REQUIRE(explained.exit_code == 0);
  auto verdict = nlohmann::json::parse(explained.output);
  CHECK(verdict["verdict"] == "miss");
  CHECK(verdict["entry"].get<std::string>().ends_with(c.pending));
  CHECK(verdict["identity"].get<std::string>().starts_with("neuronxcc-2.21.0/"));

  auto r = lnl_tool({"analyze", "--cache", c.root.string(), "--output", (c.dir / "out").string(), c.pending});
  CHECK(r.exit_code == 0);
  auto result = nlohmann::json::parse(test::slurp(c.dir / "out" / "result.json"));
  REQUIRE(result["graphs"].contains((c.root / c.pending / "graph.hlo").string()));
  CHECK(result["graphs"][(c.root / c.pending / "graph.hlo").string()]["state"] == "pending");
  r = lnl_tool({"analyze", "--cache", c.root.string(), "--output", (c.dir / "all").string()});
  CHECK(r.exit_code == 0);
  CHECK(nlohmann::json::parse(test::slurp(c.dir / "all" / "result.json"))["total"]["graphs"] == 5);
}

TEST_CASE("the content index spans both dialects: same graph, flags, target and compiler version compile once",
          "[cli][lnl][index]") {
  test::TempDir dir;
  const fs::path root = dir / "cache", log = dir / "compiles.log";
  const std::vector<std::string> env{"NEFFCACHE_FAKE_LOG=" + log.string(), "NEFFCACHE_FAKE_RATE=0"};
  auto compile = [&](std::vector<std::string> more_env = {}) {
    more_env.insert(more_env.end(), env.begin(), env.end());
    auto r = lnl_tool({"compile", "--cache", root.string(), "--compiler", k_fake_template}, more_env);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    return test::count_lines(log);
  };
  auto meta = [&](const fs::path& entry) { return detail::read_entry_meta(entry.string()); };
  // A torch-xla entry whose flags name the target, as NEURON_CC_FLAGS="--target=trn1 -O1" makes
  // them, under the fake compiler's own version...
  auto put = lnl_tool({"put", "--cache", root.string(), "--compiler-version", "2.21.0",
                   (test::k_corpus / "gopjrt_tuple.hlo.pb").string()},
                  {"NEURON_CC_FLAGS=--target=trn1 -O1"});
  REQUIRE(put.exit_code == 0);
  const fs::path neuron = put.output.substr(0, put.output.size() - 1);
  // ... LNL entries of the same graph: the same target and arguments (a twin), another
  // target, other arguments (each a program of its own).
  const std::string same = test::lnl_key("same program"), trn2 = test::lnl_key("trn2"), o2 = test::lnl_key("-O2");
  test::make_lnl_entry(root, "gopjrt_tuple.hlo.pb", same, {"-O1"});
  test::make_lnl_entry(root, "gopjrt_tuple.hlo.pb", trn2, {"-O1"});
  test::spit(root / trn2 / "command.txt", test::lnl_command_text(trn2, {"-O1"}, "trn2"));
  test::make_lnl_entry(root, "gopjrt_tuple.hlo.pb", o2, {"-O2"});

  CHECK(compile() == 3);  // the torch-xla entry and its LNL twin once, the others once each
  const std::string neff = test::slurp(neuron / "model.neff");
  CHECK(test::slurp(root / same / lnl_neff_name(same)) == neff);
  CHECK(lnl_marker_neff_size(test::slurp(root / same / ".compilation_complete")) == neff.size());
  CHECK(meta(root / same)["compiler_version"] == "2.21.0");
  for (const auto& other : {trn2, o2}) CHECK(test::slurp(root / other / lnl_neff_name(other)) != neff);

  // Later runs find the result in the index: a new LNL entry of that program compiles nothing.
  const std::string later = test::lnl_key("later");
  test::make_lnl_entry(root, "gopjrt_tuple.hlo.pb", later, {"-O1"});
  auto explained = lnl_tool({"explain", "--cache", root.string(), later, "--compiler", test::path::fake_compiler, "--json"});
  INFO(explained.output);
  REQUIRE(explained.exit_code == 0);
  CHECK(nlohmann::json::parse(explained.output)["verdict"] == "twin");
  CHECK(compile() == 3);
  CHECK(test::slurp(root / later / lnl_neff_name(later)) == neff);
  const std::string from = meta(root / later)["copied_from"];
  CHECK((from == same || from == fs::relative(neuron, root).string()));

  // Another compiler version is another program: compiled, and it now serves a torch-xla
  // entry of that version the other way round.
  const std::string newer = test::lnl_key("newer compiler");
  test::make_lnl_entry(root, "gopjrt_tuple.hlo.pb", newer, {"-O1"});
  CHECK(compile({"NEFFCACHE_FAKE_VERSION=2.22.0.0"}) == 4);
  CHECK(meta(root / newer)["compiler_version"] == "2.22.0.0");
  auto put2 = lnl_tool({"put", "--cache", root.string(), "--compiler-version", "2.22.0.0",
                    (test::k_corpus / "gopjrt_tuple.hlo.pb").string()},
                   {"NEURON_CC_FLAGS=--target=trn1 -O1"});
  REQUIRE(put2.exit_code == 0);
  const fs::path neuron2 = put2.output.substr(0, put2.output.size() - 1);
  CHECK(compile({"NEFFCACHE_FAKE_VERSION=2.22.0.0"}) == 4);
  CHECK(meta(neuron2)["copied_from"] == newer);
  CHECK(test::slurp(neuron2 / "model.neff") == test::slurp(root / newer / lnl_neff_name(newer)));

  // An LNL entry its client compiled records no compiler version: it serves nothing.
  const std::string client = test::lnl_key("client compiled");
  test::make_lnl_entry(root, "gopjrt_x_squared.hlo.pb", client, {"-O1"});
  test::spit(root / client / lnl_neff_name(client), "the client's NEFF");
  test::spit(root / client / ".compilation_complete", lnl_marker(1, 17));
  const std::string twin_of_client = test::lnl_key("twin of the client's");
  test::make_lnl_entry(root, "gopjrt_x_squared.hlo.pb", twin_of_client, {"-O1"});
  auto index = lnl_tool({"index", "--cache", root.string(), "--rebuild"});
  CHECK(index.exit_code == 0);
  CHECK(compile() == 5);
  CHECK(test::slurp(root / twin_of_client / lnl_neff_name(twin_of_client)) != "the client's NEFF");
}
