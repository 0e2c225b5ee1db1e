// Layers (cache/layers.hpp): which layer shows a name, whiteouts and opaque folders, the
// walk and the inventory over layers, and the content index looking through them while
// it writes layer 0 only.
#include <catch2/catch_test_macros.hpp>

#include <neffcache/cache/index.hpp>
#include <neffcache/cache/inventory.hpp>
#include <neffcache/cache/layers.hpp>

#include "support.hpp"

using namespace neffcache;
namespace fs = std::filesystem;

namespace {

// A done entry (HLO, NEFF, model.done) of corpus graph `graph` at `rel` below `root`.
void done_entry(const fs::path& root, const std::string& rel, const std::string& graph, const std::string& neff) {
  fs::create_directories(root / rel);
  fs::copy_file(test::k_corpus / graph, root / rel / "model.hlo_module.pb");
  test::spit(root / rel / "model.neff", neff);
  test::spit(root / rel / "model.done", "");
}

std::set<std::pair<std::string, std::size_t>> walked(const Layers& layers) {
  std::set<std::pair<std::string, std::size_t>> out;
  REQUIRE(for_each_entry(layers, [&](const LayerEntryRef& at) {
            CHECK(at.root == layers.roots()[at.layer]);
            CHECK(out.emplace(at.ref.relative_path(), at.layer).second);  // each entry once
          }).has_value());
  return out;
}

}  // namespace

TEST_CASE("a name is shown by the first layer that has it, unless a layer above hides it", "[layers]") {
  test::TempDir top, mid, low;
  const std::string a = "neuronxcc-2.21.0/MODULE_a+0", b = "neuronxcc-2.21.0/MODULE_b+0", c = "neuronxcc-2.21.0/MODULE_c+0";
  done_entry(mid.path(), a, "gopjrt_tuple.hlo.pb", "mid");
  done_entry(low.path(), a, "gopjrt_tuple.hlo.pb", "low");
  done_entry(low.path(), b, "gopjrt_tuple.hlo.pb", "low");
  done_entry(low.path(), c, "gopjrt_tuple.hlo.pb", "low");
  Layers layers(top.path().string(), {mid.path().string(), low.path().string()});
  CHECK(layers.layer_of(a) == 1u);  // first match wins
  CHECK(layers.layer_of(b) == 2u);
  CHECK(layers.path(a) == (mid / a).string());
  CHECK_FALSE(layers.layer_of("neuronxcc-2.21.0/MODULE_none+0"));
  CHECK(layers.path("neuronxcc-2.21.0/MODULE_none+0") == (top / "neuronxcc-2.21.0/MODULE_none+0").string());
  CHECK(walked(layers) == std::set<std::pair<std::string, std::size_t>>{{a, 1}, {b, 2}, {c, 2}});

  // A whiteout of b in the middle layer hides the lowest layer's b.
  test::spit(mid / "neuronxcc-2.21.0" / whiteout_of("MODULE_b+0"), "");
  CHECK_FALSE(layers.layer_of(b));
  CHECK(layers.path(b) == (top / b).string());
  // The top layer's copy of the folder, made again over its whiteout, is opaque: nothing
  // below shows through it.
  fs::create_directories(top / "neuronxcc-2.21.0");
  test::spit(top / "neuronxcc-2.21.0" / std::string(k_opaque_name), "");
  CHECK_FALSE(layers.layer_of(a));
  CHECK_FALSE(layers.layer_of(c));
  CHECK(walked(layers).empty());
  fs::remove(top / "neuronxcc-2.21.0" / std::string(k_opaque_name));
  // A whiteout of a whole folder hides everything under it.
  test::spit(top / whiteout_of("neuronxcc-2.21.0"), "");
  CHECK_FALSE(layers.layer_of(a));
  CHECK(walked(layers).empty());
  CHECK(is_layer_name(whiteout_of("x")));
  CHECK(is_layer_name(k_opaque_name));
  CHECK_FALSE(is_layer_name("MODULE_a+0"));
}

TEST_CASE("the inventory over layers lists each entry once, in its layer; an upper folder that is still empty is none",
          "[layers]") {
  test::TempDir dir, low;
  const std::string a = "neuronxcc-2.21.0/MODULE_a+0", b = "neuronxcc-2.21.0/MODULE_b+0";
  done_entry(low.path(), a, "gopjrt_tuple.hlo.pb", "low");
  done_entry(low.path(), b, "gopjrt_tuple.hlo.pb", "low");
  const fs::path top = dir / "upper";  // not made yet
  auto listed = list_entries(Layers(top.string(), {low.path().string()}));
  REQUIRE(listed);
  CHECK(listed->size() == 2);
  for (const auto& e : *listed) {
    CHECK(e.layer == 1);
    CHECK(e.state == EntryState::done);
    CHECK(e.neff_bytes == 3);
  }
  fs::create_directories(top / a);
  fs::copy_file(test::k_corpus / "gopjrt_tuple.hlo.pb", top / a / "model.hlo_module.pb");
  auto counts = count_entries(Layers(top.string(), {low.path().string()}));
  REQUIRE(counts);
  CHECK(counts->pending == 1);  // the top layer's copy of a, whole
  CHECK(counts->done == 1);
  CHECK_FALSE(list_entries((dir / "missing").string()));  // one layer: a missing root is an error
}

TEST_CASE("the content index over layers records in layer 0 only, reads a lower layer's own index, and never serves a hidden entry",
          "[layers][index]") {
  test::TempDir top, low;
  const std::string a = "neuronxcc-2.21.0/MODULE_a+0", shipped = "neuronxcc-2.21.0/MODULE_shipped+0";
  done_entry(low.path(), a, "gopjrt_tuple.hlo.pb", "the NEFF of a");
  done_entry(low.path(), shipped, "rocm08_normal_9.hlo_proto.pb", "the NEFF of shipped");
  // The lower cache came with an index of its own, recording `shipped`.
  auto shipped_id = entry_content_id((low / shipped).string());
  REQUIRE(shipped_id);
  REQUIRE(ContentIndex(low.path().string()).add(*shipped_id, shipped));
  const auto before = test::snapshot_tree(low.path());

  ContentIndex index(top.path().string(), {low.path().string()});
  auto id = entry_content_id(index.entry_dir(a));
  REQUIRE(id);
  REQUIRE(index.add(*id, a));  // an entry of the lower layer, recorded in layer 0
  CHECK(fs::exists(top / ".neffcache" / "index"));
  auto twin = index.find(*id, "neuronxcc-2.21.0/MODULE_twin+0", false);
  REQUIRE(twin);
  CHECK(twin->dir == (low / a).string());
  CHECK(twin->record.entry == a);
  auto from_lower = index.find(*shipped_id, "neuronxcc-2.21.0/MODULE_twin+1", false);
  REQUIRE(from_lower);
  CHECK(from_lower->dir == (low / shipped).string());
  CHECK(index.ids_of_graph(shipped_id->graph_sha256) == std::vector<ContentId>{*shipped_id});
  // The index scan reads the lower layer's entries, and records them in layer 0.
  auto scan = index_unknown_entries(index, 100);
  CHECK(scan.entries == 2);
  CHECK(scan.added == 1);  // `a` is known already
  CHECK(index.knows(shipped));

  // Hidden by a whiteout in layer 0: the record fails its check, and is dropped there.
  fs::create_directories(top / "neuronxcc-2.21.0");
  test::spit(top / "neuronxcc-2.21.0" / whiteout_of("MODULE_a+0"), "");
  std::vector<std::string> logged;
  CHECK_FALSE(index.find(*id, "neuronxcc-2.21.0/MODULE_twin+0", false, [&](std::string_view l) { logged.emplace_back(l); }));
  CHECK(logged.size() == 1);
  CHECK(index.records(*id).empty());
  // Nothing of the lower layer changed, its index included.
  CHECK(test::snapshot_tree(low.path()) == before);
}
