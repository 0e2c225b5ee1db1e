// The content index of a bucket (s3/index.hpp): a graph compiled under one entry is served
// to an entry of the same graph under any other name without a compile, by a server-side
// copy; a record that names another graph, or a NEFF that is not the one recorded, is
// never served and is dropped; `neffcache index` records what others published and
// forgets what is gone.
#include <filesystem>
#include <optional>
#include <string>

#include <catch2/catch_test_macros.hpp>
#include <catch2/matchers/catch_matchers_string.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/cache/lnl.hpp>
#include <neffcache/s3/cache.hpp>
#include <neffcache/s3/index.hpp>

#include "lnl.hpp"
#include "s3_support.hpp"
#include "support.hpp"

using namespace neffcache;
using Catch::Matchers::ContainsSubstring;
namespace fs = std::filesystem;

namespace {

std::string entry_of(int i) { return fmt::format("{}/MODULE_{}+4f2d9c1a", test::k_fake_dir, 4000 + i); }

// Stores the pending entry `rel` with the corpus graph `graph`.
void put_graph(S3Client& s3, const std::string& rel, int graph) {
  auto corpus = test::corpus_files();
  REQUIRE(s3.put(rel + "/compile_flags.json", R"(["--target=trn1"])").has_value());
  REQUIRE(s3.put(rel + "/model.hlo_module.pb", test::slurp(corpus[static_cast<std::size_t>(graph)])).has_value());
}

struct Compiles {
  test::TempDir dir;
  fs::path log = dir / "fake.log";
  // `neffcache compile` on the bucket, the fake compiler counting its runs.
  test::ToolRun run(S3Client& s3, const std::vector<std::string>& more = {}, std::vector<std::string> env = {}) {
    std::vector<std::string> args{"compile", "--cache", fmt::format("s3://{}", s3.bucket()), "--compiler",
                                  test::k_fake_template};
    args.insert(args.end(), more.begin(), more.end());
    env.insert(env.end(), {"NEFFCACHE_FAKE_RATE=0", "NEFFCACHE_FAKE_LOG=" + log.string()});
    return test::run(test::s3_tool_argv(args, env));
  }
  int count() const { return test::count_lines(log); }
};

std::string neff_of(S3Client& s3, const std::string& rel) {
  auto got = s3.get(rel + "/model.neff");
  REQUIRE(got.has_value());
  return *got;
}

// The identity the index holds for entry_of(0), and its one record: the first compile's.
std::pair<ContentId, IndexRecord> only_record_of_first(const S3Index& index) {
  auto id = index.id_of(entry_of(0));
  REQUIRE(id.has_value());
  auto records = index.records(*id);
  REQUIRE(records.size() == 1);
  return {*id, records[0]};
}

}  // namespace

TEST_CASE("a graph compiled under one S3 entry is served to its twin under another name, without a compile",
          "[s3][index]") {
  auto s3 = test::fresh_bucket("twin");
  Compiles compiles;
  put_graph(*s3, entry_of(0), 0);
  auto first = compiles.run(*s3);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(compiles.count() == 1);
  const S3Index index(*s3, "");
  const auto [id, record] = only_record_of_first(index);
  CHECK(record.size == neff_of(*s3, entry_of(0)).size());
  CHECK(record.xxh3.size() == 16);
  CHECK_FALSE(record.etag.empty());

  // The same graph and flags under another name (another path, another client).
  put_graph(*s3, entry_of(1), 0);
  auto second = compiles.run(*s3, {"--json"});
  INFO(second.output);
  CHECK(second.exit_code == 0);
  CHECK(compiles.count() == 1);  // no compile
  CHECK(neff_of(*s3, entry_of(1)) == neff_of(*s3, entry_of(0)));
  CHECK(s3->head(entry_of(1) + "/model.done").has_value());
  CHECK(index.id_of(entry_of(1)) == id);
  CHECK(index.records(id).size() == 2);
  // The listing of entries is not troubled by the index's objects.
  auto listing = list_s3_entries(*s3, "");
  REQUIRE(listing.has_value());
  CHECK(listing->size() == 2);
  // The twin is one to `stats`, with the compile it saved.
  for (const auto& e : *listing) CHECK(e.copied_from == (e.path == entry_of(1) ? std::optional(entry_of(0)) : std::nullopt));
  auto stats = test::run(test::s3_tool_argv({"stats", "--cache", fmt::format("s3://{}", s3->bucket()), "--json"}));
  INFO(stats.output);
  REQUIRE(stats.exit_code == 0);
  CHECK(nlohmann::json::parse(stats.output)["twins"] == 1);
}

TEST_CASE("an S3 index record that names another graph, or a NEFF replaced since, is dropped and never served",
          "[s3][index]") {
  auto s3 = test::fresh_bucket("tamper");
  Compiles compiles;
  put_graph(*s3, entry_of(0), 0);
  put_graph(*s3, entry_of(1), 1);
  REQUIRE(compiles.run(*s3).exit_code == 0);
  REQUIRE(compiles.count() == 2);
  const S3Index index(*s3, "");
  auto id0 = index.id_of(entry_of(0)), id1 = index.id_of(entry_of(1));
  REQUIRE(id0.has_value());
  REQUIRE(id1.has_value());
  REQUIRE(*id0 != *id1);

  SECTION("a record pointing graph 0's identity at graph 1's entry") {
    // Whoever can write to the bucket writes a record: graph 0 "is" entry 1, with entry
    // 1's true size and ETag. The only honest record of graph 0 goes.
    auto honest = index.records(*id1);
    REQUIRE(honest.size() == 1);
    REQUIRE(s3->put(index.record_key(*id0, entry_of(1)), honest[0].to_json().dump()).has_value());
    index.forget(*id0, entry_of(0));
    REQUIRE(remove_s3_entry(*s3, "", entry_of(0)).has_value());

    put_graph(*s3, entry_of(2), 0);
    auto r = compiles.run(*s3);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(compiles.count() == 3);  // compiled, not served from entry 1
    CHECK(neff_of(*s3, entry_of(2)) != neff_of(*s3, entry_of(1)));
    for (const auto& rec : index.records(*id0)) CHECK(rec.entry != entry_of(1));  // dropped
    CHECK(index.records(*id1).size() == 1);  // entry 1's own record stays
  }
  SECTION("a record whose NEFF was replaced after it was recorded") {
    REQUIRE(s3->put(entry_of(0) + "/model.neff", "not the NEFF that was recorded").has_value());
    put_graph(*s3, entry_of(2), 0);
    auto r = compiles.run(*s3);
    INFO(r.output);
    CHECK(r.exit_code == 0);
    CHECK(compiles.count() == 3);
    CHECK(neff_of(*s3, entry_of(2)) != "not the NEFF that was recorded");
    for (const auto& rec : index.records(*id0)) CHECK(rec.entry != entry_of(0));
  }
}

TEST_CASE("neffcache index on a bucket records what others published and forgets what is gone",
          "[s3][index]") {
  auto s3 = test::fresh_bucket("scan");
  Compiles compiles;
  // Published as another tool or an older version would: results without records.
  for (int i = 0; i < 3; ++i) {
    put_graph(*s3, entry_of(i), i);
    REQUIRE(s3->put(entry_of(i) + "/model.neff", fmt::format("NEFF of graph {}", i)).has_value());
    REQUIRE(s3->put(entry_of(i) + "/model.done", "").has_value());
  }
  const S3Index index(*s3, "");
  CHECK_FALSE(index.id_of(entry_of(0)).has_value());
  const std::string url = fmt::format("s3://{}", s3->bucket());
  auto scan = test::run(test::s3_tool_argv({"index", "--cache", url}));
  INFO(scan.output);
  CHECK(scan.exit_code == 0);
  CHECK_THAT(scan.output, ContainsSubstring("3 done or failed entries, 3 recorded now"));
  auto id = index.id_of(entry_of(0));
  REQUIRE(id.has_value());
  auto records = index.records(*id);
  REQUIRE(records.size() == 1);
  CHECK(records[0].xxh3.empty());  // not downloaded to be hashed: the ETag stands for it
  // A twin of such a record is served.
  put_graph(*s3, entry_of(3), 0);
  REQUIRE(compiles.run(*s3).exit_code == 0);
  CHECK(compiles.count() == 0);
  CHECK(neff_of(*s3, entry_of(3)) == "NEFF of graph 0");

  // explain reads the bucket's index: a twin, then a miss (nearest graphs are not looked for).
  put_graph(*s3, entry_of(4), 1);
  auto twin = test::run(test::s3_tool_argv({"explain", "--cache", url, entry_of(4)}));
  INFO(twin.output);
  CHECK(twin.exit_code == 0);
  CHECK_THAT(twin.output, ContainsSubstring("twin: s3://" + s3->bucket() + "/" + entry_of(4) + " is not compiled, but "
                                            "s3://" + s3->bucket() + "/" + entry_of(1) + " holds the same graph"));
  put_graph(*s3, entry_of(5), 5);
  auto miss = test::run(test::s3_tool_argv({"explain", "--cache", url, entry_of(5)}));
  INFO(miss.output);
  CHECK(miss.exit_code == 0);
  CHECK_THAT(miss.output, ContainsSubstring("miss: "));
  CHECK_THAT(miss.output, ContainsSubstring("not looked for in a bucket"));

  // An entry removed (as gc removes it) loses its records at the next index.
  REQUIRE(remove_s3_entry(*s3, "", entry_of(1)).has_value());
  auto again = test::run(test::s3_tool_argv({"index", "--cache", url}));
  INFO(again.output);
  CHECK(again.exit_code == 0);
  CHECK_THAT(again.output, ContainsSubstring("1 record of entries gone forgotten"));
  CHECK_FALSE(index.id_of(entry_of(1)).has_value());
  CHECK(index.id_of(entry_of(0)).has_value());
}

TEST_CASE("sync push records what it uploads in the bucket's index: a twin of a pushed graph compiles nowhere",
          "[s3][index]") {
  auto s3 = test::fresh_bucket("pushindex");
  test::TempDir dir;
  const fs::path folder = dir / "cache";
  fs::create_directories(folder / entry_of(0));
  auto corpus = test::corpus_files();
  test::spit(folder / entry_of(0) / "compile_flags.json", R"(["--target=trn1"])");
  test::spit(folder / entry_of(0) / "model.hlo_module.pb", test::slurp(corpus[0]));
  Compiles compiles;
  auto made = test::run_tool({"compile", "--cache", folder.string(), "--compiler", test::k_fake_template},
                             {"NEFFCACHE_FAKE_LOG=" + compiles.log.string()});
  REQUIRE(made.exit_code == 0);
  REQUIRE(compiles.count() == 1);
  const std::string url = fmt::format("s3://{}", s3->bucket());
  auto pushed = test::run(test::s3_tool_argv({"sync", "push", folder.string(), url}));
  INFO(pushed.output);
  REQUIRE(pushed.exit_code == 0);
  const S3Index index(*s3, "");
  const auto [id, record] = only_record_of_first(index);
  CHECK(record.compile_seconds > 0);  // from the entry's publication record: what a twin saves
  put_graph(*s3, entry_of(1), 0);
  REQUIRE(compiles.run(*s3).exit_code == 0);
  CHECK(compiles.count() == 1);
  CHECK(neff_of(*s3, entry_of(1)) == test::slurp(folder / entry_of(0) / "model.neff"));
}

TEST_CASE("a graph that failed to compile in one S3 entry fails its twin under another name without a compile",
          "[s3][index]") {
  auto s3 = test::fresh_bucket("failtwin");
  Compiles compiles;
  put_graph(*s3, entry_of(0), 2);
  auto first = compiles.run(*s3, {}, {"NEFFCACHE_FAKE_FAIL=1"});
  INFO(first.output);
  CHECK(first.exit_code == 1);
  REQUIRE(compiles.count() == 1);
  const S3Index index(*s3, "");
  const auto [id, record] = only_record_of_first(index);
  CHECK(record.failed);
  put_graph(*s3, entry_of(1), 2);
  auto second = compiles.run(*s3);
  INFO(second.output);
  CHECK(second.exit_code == 1);  // it fails too: same graph, same flags, same compiler
  CHECK(compiles.count() == 1);
  CHECK(s3->head(entry_of(1) + "/model.log").has_value());
  CHECK_FALSE(s3->head(entry_of(1) + "/model.neff").has_value());
}

TEST_CASE("a bucket's record of an entry keyed with another host's default flags is left alone, not dropped",
          "[s3][index]") {
  auto s3 = test::fresh_bucket("flagsdoubt");
  Compiles compiles;
  // Entry 0 has no compile_flags.json: its flags are the compiling host's NEURON_CC_FLAGS.
  auto corpus = test::corpus_files();
  REQUIRE(s3->put(entry_of(0) + "/model.hlo_module.pb", test::slurp(corpus[3])).has_value());
  REQUIRE(compiles.run(*s3, {}, {"NEURON_CC_FLAGS=--target=trn1 -O1"}).exit_code == 0);
  REQUIRE(compiles.count() == 1);
  const S3Index index(*s3, "");
  auto id = index.id_of(entry_of(0));
  REQUIRE(id.has_value());
  // Entry 1 names those flags in its own compile_flags.json: the same identity. A host whose
  // NEURON_CC_FLAGS differ cannot tell what entry 0 was keyed with: it compiles, and leaves
  // the record for hosts that can.
  REQUIRE(s3->put(entry_of(1) + "/compile_flags.json", R"(["--target=trn1", "-O1"])").has_value());
  REQUIRE(s3->put(entry_of(1) + "/model.hlo_module.pb", test::slurp(corpus[3])).has_value());
  auto other = compiles.run(*s3, {}, {"NEURON_CC_FLAGS=--target=trn1 -O2"});
  INFO(other.output);
  CHECK(other.exit_code == 0);
  CHECK(index.id_of(entry_of(1)) == id);
  CHECK(compiles.count() == 2);
  bool kept = false;
  for (const auto& r : index.records(*id)) kept = kept || r.entry == entry_of(0);
  CHECK(kept);
}

namespace {

// Stores the pending LNL entry `key` with the corpus file `corpus` as its graph.
void put_lnl_graph(S3Client& s3, const fs::path& scratch, const std::string& key, const std::string& corpus) {
  auto folder = test::make_lnl_entry(scratch, corpus, key, {"-O2"});
  for (const char* f : {"command.txt", ".artifact_metadata_v0.json", "graph.hlo"})
    REQUIRE(s3.upload(key + "/" + f, (folder / f).string()).has_value());
}

}  // namespace

TEST_CASE("an LNL entry compiled on a bucket is indexed: a twin under another key compiles nowhere",
          "[s3][index][lnl]") {
  auto s3 = test::fresh_bucket("lnltwin");
  Compiles compiles;
  const std::string a = test::lnl_key("bucket twin a"), b = test::lnl_key("bucket twin b");
  put_lnl_graph(*s3, compiles.dir / "src", a, "spu_tf_jit_comp.hlo.pb");
  auto first = compiles.run(*s3);
  INFO(first.output);
  REQUIRE(first.exit_code == 0);
  REQUIRE(compiles.count() == 1);
  // The compile's record names the compiler version the entry's identity needs.
  auto meta = s3->get(a + "/.neffcache-meta.json");
  REQUIRE(meta.has_value());
  const auto record = nlohmann::json::parse(*meta);
  const std::string neff = s3->get(a + "/" + lnl_neff_name(a)).value();
  CHECK(record["size"] == neff.size());
  const S3Index index(*s3, "");
  auto id = index.id_of(a);
  REQUIRE(id.has_value());
  CHECK(id->compiler_dir == compiler_dir_name(record["compiler_version"].get<std::string>()));

  SECTION("the same graph and arguments under another key is served by a copy") {
    put_lnl_graph(*s3, compiles.dir / "src", b, "spu_tf_jit_comp.hlo.pb");
    auto second = compiles.run(*s3);
    INFO(second.output);
    CHECK(second.exit_code == 0);
    CHECK(compiles.count() == 1);  // no compile
    CHECK(s3->get(b + "/" + lnl_neff_name(b)).value() == neff);
    // Done as LNL's hit test and `verify` read it: the marker names the NEFF's size.
    auto marker = s3->get(b + "/.compilation_complete");
    REQUIRE(marker.has_value());
    CHECK(lnl_marker_neff_size(*marker) == neff.size());
    CHECK(index.id_of(b) == id);
    // The twin's own record names the version too: a twin for others in turn.
    const auto twin = nlohmann::json::parse(s3->get(b + "/.neffcache-meta.json").value());
    CHECK(twin["compiler_version"] == record["compiler_version"]);
    CHECK(twin["copied_from"] == a);
    auto stats = test::run(test::s3_tool_argv({"stats", "--cache", fmt::format("s3://{}", s3->bucket()), "--json"}));
    INFO(stats.output);
    CHECK(nlohmann::json::parse(stats.output)["twins"] == 1);
  }
  SECTION("a record that names another compiler version is dropped, and the graph compiles") {
    auto lie = record;
    lie["compiler_version"] = "9.9.9";
    REQUIRE(s3->put(a + "/.neffcache-meta.json", lie.dump()).has_value());
    put_lnl_graph(*s3, compiles.dir / "src", b, "spu_tf_jit_comp.hlo.pb");
    auto second = compiles.run(*s3);
    INFO(second.output);
    CHECK(second.exit_code == 0);
    CHECK(compiles.count() == 2);
    for (const auto& r : index.records(*id)) CHECK(r.entry != a);
  }
  SECTION("a NEFF replaced since, of the same size, makes the record count for nothing") {
    std::string other = neff;
    other[0] = static_cast<char>(other[0] ^ 0x5a);
    REQUIRE(s3->put(a + "/" + lnl_neff_name(a), other).has_value());
    put_lnl_graph(*s3, compiles.dir / "src", b, "spu_tf_jit_comp.hlo.pb");
    auto second = compiles.run(*s3);
    INFO(second.output);
    CHECK(second.exit_code == 0);
    CHECK(compiles.count() == 2);  // compiled, not served the replaced NEFF
    CHECK(s3->get(b + "/" + lnl_neff_name(b)).value() != other);
  }
  SECTION("an entry without our record (promoted or pushed from elsewhere) has no identity") {
    REQUIRE(s3->remove(a + "/.neffcache-meta.json").has_value());
    index.forget(a);
    auto scanned = test::run(test::s3_tool_argv({"index", "--cache", fmt::format("s3://{}", s3->bucket())}));
    INFO(scanned.output);
    CHECK(scanned.exit_code == 0);
    CHECK_FALSE(index.id_of(a).has_value());
    // A record again (as our compile writes it): the scan indexes it.
    REQUIRE(s3->put(a + "/.neffcache-meta.json", record.dump()).has_value());
    REQUIRE(test::run(test::s3_tool_argv({"index", "--cache", fmt::format("s3://{}", s3->bucket())})).exit_code == 0);
    CHECK(index.id_of(a) == id);
  }
}
