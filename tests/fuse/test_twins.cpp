// Twins through the mount (the content index): a graph compiled once under one name is
// read under any other with no compile, across a restart of the daemon and for entries
// written straight into the backing folder by another tool; another graph compiles.
#include <neffcache/cache/record.hpp>

#include "fuse_test.hpp"
#include "hlo_variants.hpp"
#include "lnl.hpp"

using namespace fusetest;

namespace {

constexpr const char* k_cnn_graph = "spu_jax_cnn.hlo.pb";

// A pending entry of `hlo` written straight into the backing folder.
std::string put_entry_hlo(const fs::path& backing, const std::string& name, const std::string& hlo) {
  std::string rel = "neuronxcc-2.21.0/MODULE_" + name;
  fs::create_directories(backing / rel);
  test::spit(backing / rel / "model.hlo_module.pb", hlo);
  return rel;
}

nlohmann::json stats_of(const Mount& m) {
  return nlohmann::json::parse(test::slurp(m.mnt() / ".neffcache" / "stats.json"));
}

}  // namespace

TEST_CASE("a restarted daemon serves a metadata twin of a done entry with no compile", "[fuse][index]") {
  test::TempDir shared;
  const std::string hlo = test::slurp(test::k_corpus / k_cnn_graph);
  std::string original;
  {
    Mount m({}, {}, shared.path());
    auto a = put_entry_hlo(m.backing(), "1", hlo);
    auto [err, bytes] = read_all(m.mnt() / a / "model.neff");
    REQUIRE(err == 0);
    original = bytes;
    CHECK(m.compiles() == 1);
  }
  Mount m({}, {}, shared.path());
  auto b = put_entry_hlo(m.backing(), "2", test::debug_variant(hlo));
  auto [err, bytes] = read_all(m.mnt() / b / "model.neff");
  REQUIRE(err == 0);
  CHECK(bytes == original);
  CHECK(m.compiles() == 0);
  auto stats = stats_of(m);
  CHECK(stats["twins"]["served"] == 1);
  CHECK(stats["compiles"]["started"] == 0);
  auto meta = nlohmann::json::parse(test::slurp(m.backing() / b / ".neffcache-meta.json"));
  CHECK(meta["copied_from"] == "neuronxcc-2.21.0/MODULE_1");

  // One opcode changed: another graph, compiled.
  auto c = put_entry_hlo(m.backing(), "3", test::opcode_variant(hlo));
  CHECK(read_all(m.mnt() / c / "model.neff").first == 0);
  CHECK(m.compiles() == 1);
}

TEST_CASE("a done entry another tool wrote into the backing folder serves its twins", "[fuse][index]") {
  test::TempDir shared;
  const std::string hlo = test::slurp(test::k_corpus / k_cnn_graph);
  // As a Neuron client or a copy from another host leaves it: no metadata of ours.
  auto a = put_entry_hlo(shared.path(), "elsewhere", hlo);
  test::spit(shared.path() / a / "model.neff", "NEFF compiled on another host");
  test::spit(shared.path() / a / "model.done", "");
  Mount m({}, {}, shared.path());
  for (int i = 0; i < 500 && stats_of(m)["index"]["scan"] != "done"; ++i) std::this_thread::sleep_for(10ms);
  REQUIRE(stats_of(m)["index"]["scan"] == "done");
  CHECK(stats_of(m)["index"]["scan_added"] == 1);
  auto b = put_entry_hlo(m.backing(), "mine", test::debug_variant(hlo));
  auto [err, bytes] = read_all(m.mnt() / b / "model.neff");
  REQUIRE(err == 0);
  CHECK(bytes == "NEFF compiled on another host");
  CHECK(m.compiles() == 0);
}

TEST_CASE("with --no-content-index a twin compiles", "[fuse][index]") {
  test::TempDir shared;
  const std::string hlo = test::slurp(test::k_corpus / k_cnn_graph);
  Mount m({}, {"--no-content-index"}, shared.path());
  auto a = put_entry_hlo(m.backing(), "1", hlo);
  REQUIRE(read_all(m.mnt() / a / "model.neff").first == 0);
  auto b = put_entry_hlo(m.backing(), "2", test::debug_variant(hlo));
  REQUIRE(read_all(m.mnt() / b / "model.neff").first == 0);
  CHECK(m.compiles() == 2);
  CHECK(stats_of(m)["twins"]["served"] == 0);
}

TEST_CASE("both dialects through the mount: an LNL entry of a torch-xla entry's program gets its NEFF, no compile",
          "[fuse][index][lnl]") {
  Mount m;
  const std::string hlo = test::slurp(test::k_corpus / k_cnn_graph);
  // torch-xla's entry of the graph, its flags naming the target, under the version of the
  // compiler the daemon runs (fake-neuronx-cc --version).
  const std::string neuron = "neuronxcc-2.21.0/MODULE_xla";
  fs::create_directories(m.backing() / neuron);
  test::spit(m.backing() / neuron / "compile_flags.json", R"(["--target=trn1", "-O1"])");
  test::spit(m.backing() / neuron / "model.hlo_module.pb", hlo);
  auto [err, original] = read_all(m.mnt() / neuron / "model.neff");
  REQUIRE(err == 0);
  CHECK(m.compiles() == 1);

  // vLLM's entry of the same program (its names differ: LNL traced it), then another target.
  const std::string key = test::lnl_key("vllm"), trn2 = test::lnl_key("vllm on trn2");
  test::make_lnl_entry(m.backing(), k_cnn_graph, key, {"-O1"});
  test::spit(m.backing() / key / "graph.hlo", test::debug_variant(hlo));
  auto [lerr, bytes] = read_all(m.mnt() / key / lnl_neff_name(key));
  REQUIRE(lerr == 0);
  CHECK(bytes == original);
  CHECK(m.compiles() == 1);
  CHECK(read_all(m.mnt() / key / ".compilation_complete").second.ends_with(fmt::format("neff_size:{}\n", bytes.size())));
  auto meta = detail::read_entry_meta((m.backing() / key).string());
  CHECK(meta["copied_from"] == neuron);
  CHECK(meta["compiler_version"] == "2.21.0");
  CHECK(stats_of(m)["twins"]["served"] == 1);

  test::make_lnl_entry(m.backing(), k_cnn_graph, trn2, {"-O1"});
  test::spit(m.backing() / trn2 / "command.txt", test::lnl_command_text(trn2, {"-O1"}, "trn2"));
  CHECK(read_all(m.mnt() / trn2 / lnl_neff_name(trn2)).first == 0);
  CHECK(m.compiles() == 2);
}
