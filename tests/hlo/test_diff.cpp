// The graph diff (hlo/diff.hpp): counts of added, removed and changed instructions and
// the first that differ, on corpus graphs and on hand-written canonical text.
#include <tuple>

#include <catch2/catch_test_macros.hpp>
#include <fmt/ranges.h>

#include <neffcache/hlo/diff.hpp>

#include "support.hpp"

using namespace neffcache;

namespace {

HloSplit split(const std::string& bytes) {
  auto s = split_hlo(bytes);
  INFO((s ? "" : s.error().message));
  REQUIRE(s.has_value());
  return std::move(*s);
}

// `bytes` with every `from` replaced by `to` (same length, so the protobuf stays valid).
std::string replace_all(std::string bytes, std::string_view from, std::string_view to) {
  REQUIRE(from.size() == to.size());
  std::size_t count = 0;
  for (auto at = bytes.find(from); at != std::string::npos; at = bytes.find(from, at + to.size()), ++count)
    bytes.replace(at, from.size(), to);
  REQUIRE(count > 0);
  return bytes;
}

// Canonical text of a computation whose instructions are given as (id, opcode, operands).
std::string canonical(const std::vector<std::tuple<int, std::string, std::vector<int>>>& instructions) {
  std::string text = "neffcache canonical hlo v1\ncomputations {\n";
  for (const auto& [id, opcode, operands] : instructions) {
    text += fmt::format("  instructions {{\n    opcode \"{}\"\n    id %{}\n", opcode, id);
    if (!operands.empty()) text += fmt::format("    operand_ids [%{}]\n", fmt::join(operands, ", %"));
    text += "  }\n";
  }
  return text + "  id @0\n}\nentry_computation_id @0\n";
}

HloUnits units_of(const std::string& text) {
  HloUnitSplitter s;
  // In two pieces cut mid-line, as a sink may receive it.
  s.feed(std::string_view(text).substr(0, text.size() / 2));
  s.feed(std::string_view(text).substr(text.size() / 2));
  return s.finish();
}

}  // namespace

TEST_CASE("equal graphs have no differences", "[hlo][diff]") {
  for (const char* name : {"gopjrt_x_squared.hlo.pb", "spu_jax_cnn.hlo.pb", "rocm08_forward_3d_conv_15.hlo_proto.pb"}) {
    auto g = split(test::slurp(test::k_corpus / name));
    CHECK(g.units.instructions.size() == g.analysis.stats.instructions);
    auto d = diff_hlo_units(g.units, g.units);
    CHECK(d.equal());
    CHECK(d.first_cached.empty());
    CHECK(d.first_asked.empty());
  }
}

TEST_CASE("one changed opcode is one changed instruction, named on both sides", "[hlo][diff]") {
  const std::string bytes = test::slurp(test::k_corpus / "gopjrt_x_squared.hlo.pb");
  // The opcode string only: the instruction's name "multiply.2" keeps its prefix.
  const std::string edited = replace_all(bytes, std::string("\x08multiply", 9), std::string("\x08subtract", 9));
  auto cached = split(bytes), asked = split(edited);
  REQUIRE(cached.analysis.canonical_sha256 != asked.analysis.canonical_sha256);
  auto d = diff_hlo_units(cached.units, asked.units);
  CHECK(d.of_instructions);
  CHECK(d.changed == 1);
  CHECK(d.added == 0);
  CHECK(d.removed == 0);
  CHECK(d.first_cached.find("\"multiply\"") != std::string::npos);
  CHECK(d.first_asked.find("\"subtract\"") != std::string::npos);
}

TEST_CASE("two different corpus graphs differ in counted instructions", "[hlo][diff]") {
  auto cached = split(test::slurp(test::k_corpus / "gopjrt_jax_xp1.hlo.pb"));
  auto asked = split(test::slurp(test::k_corpus / "spu_jax_cnn.hlo.pb"));
  auto d = diff_hlo_units(cached.units, asked.units);
  CHECK(d.of_instructions);
  CHECK(d.added + d.changed > 0);
  CHECK(d.added + d.changed + d.removed >= asked.units.instructions.size() - cached.units.instructions.size());
  CHECK_FALSE(d.first_asked.empty());
  CHECK(d.first_asked.size() <= k_diff_shown_chars + 3);
}

TEST_CASE("an inserted instruction is one addition: ids are relative", "[hlo][diff]") {
  auto cached = units_of(canonical({{0, "parameter", {}}, {1, "negate", {0}}, {2, "add", {0, 1}}, {3, "tanh", {2}}}));
  auto asked = units_of(canonical(
      {{0, "parameter", {}}, {1, "negate", {0}}, {2, "abs", {1}}, {3, "add", {0, 2}}, {4, "tanh", {3}}}));
  REQUIRE(asked.instructions.size() == 5);
  CHECK(asked.instructions[4] == "instructions { opcode \"tanh\" operand_ids [^1] }");
  auto d = diff_hlo_units(cached, asked);
  // The add now takes the abs (one back) where it took the negate: it changed too.
  CHECK(d.added == 1);
  CHECK(d.changed == 1);
  CHECK(d.removed == 0);
  CHECK(d.first_cached.find("\"add\"") != std::string::npos);
  CHECK(d.first_asked.find("\"abs\"") != std::string::npos);

  SECTION("a removed one, the other way round") {
    auto r = diff_hlo_units(asked, cached);
    CHECK(r.removed == 1);
    CHECK(r.changed == 1);
    CHECK(r.added == 0);
  }
  SECTION("many differences are counted as multisets, with the same totals") {
    std::vector<std::string> a, b;
    for (std::size_t i = 0; i < k_diff_lcs_limit + 10; ++i) a.push_back(fmt::format("u{}", i));
    b = a;
    b[5] = "other";
    b.push_back("extra");
    std::rotate(b.begin() + 3, b.begin() + 4, b.end() - 2);  // move a unit: no difference by count
    auto m = diff_units(a, b);
    CHECK(m.changed == 1);
    CHECK(m.added == 1);
    CHECK(m.removed == 0);
  }
}

TEST_CASE("equal instructions: the other fields are compared", "[hlo][diff]") {
  auto cached = units_of(canonical({{0, "parameter", {}}, {1, "negate", {0}}}));
  std::string text = canonical({{0, "parameter", {}}, {1, "negate", {0}}});
  text.replace(text.find("entry_computation_id @0"), 23, "entry_computation_id @1");
  auto d = diff_hlo_units(cached, units_of(text));
  CHECK_FALSE(d.of_instructions);
  CHECK(d.changed == 1);
  CHECK(d.first_cached == "entry_computation_id @0");
  CHECK(d.first_asked == "entry_computation_id @1");
}
