#include <fstream>
#include <map>
#include <regex>
#include <sstream>

#include <catch2/catch_test_macros.hpp>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <neffcache/hlo/hlo.hpp>

#include "hlo_subset.pb.h"
#include "support.hpp"

using namespace neffcache;

namespace {

struct Expected {
  std::string format;
  uint64_t computations, instructions;
};

// The corpus's own description (SOURCES.md, written when the files were collected)
// gives each file's proto type and its computation / instruction counts.
std::map<std::string, Expected> sources_table() {
  std::ifstream in(test::k_corpus / "SOURCES.md");
  std::regex row(R"(^\| ([a-z0-9_]+\.(?:hlo|hlo_proto)\.pb) \| \d+ \| [0-9a-f]+ \| (\w+) \| (\d+) / (\d+) \|)");
  std::map<std::string, Expected> out;
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, row))
      out[m[1]] = {m[2], std::stoull(m[3]), std::stoull(m[4])};
  }
  return out;
}

HloAnalysis analyze(const std::string& bytes, std::string* dump = nullptr) {
  auto r = analyze_hlo(bytes, dump ? CanonicalSink([dump](std::string_view p) { *dump += p; })
                                   : CanonicalSink{});
  INFO((r ? "" : r.error().message));
  REQUIRE(r.has_value());
  return std::move(*r);
}

}  // namespace

TEST_CASE("every corpus file parses with the format and counts SOURCES.md gives", "[hlo]") {
  auto table = sources_table();
  auto files = test::corpus_files();
  REQUIRE(table.size() == files.size());
  for (const auto& f : files) {
    INFO(f.filename());
    auto a = analyze(test::slurp(f));
    const auto& e = table.at(f.filename().string());
    CHECK(to_string(a.stats.format) == e.format);
    CHECK(a.stats.computations == e.computations);
    CHECK(a.stats.instructions == e.instructions);
    uint64_t histogram_total = 0;
    for (const auto& [op, n] : a.stats.opcodes) histogram_total += n;
    CHECK(histogram_total == a.stats.instructions);
    CHECK(a.stats.opcodes.count("parameter") == 1);
    CHECK(a.stats.entry_parameters >= 1);
    CHECK(a.stats.entry_parameters <= a.stats.opcodes.at("parameter"));
    CHECK(a.graph_hash.size() == k_graph_hash_digits);
    CHECK(a.canonical_sha256.substr(0, k_graph_hash_digits) == a.graph_hash);
  }
}

TEST_CASE("graph hashes of the corpus are pinned", "[hlo]") {
  // Any change to the canonical form moves every key and turns a warm cache cold; it
  // must come with a new k_canonical_version and a regenerated list
  // (neffcache hlo-stats --json on each corpus file).
  std::ifstream in(test::k_data / "corpus_graph_hashes.txt");
  std::map<std::string, std::string> pinned;
  for (std::string hash, name; in >> hash >> name;) pinned[name] = hash;
  auto files = test::corpus_files();
  REQUIRE(pinned.size() == files.size());
  for (const auto& f : files) {
    INFO(f.filename());
    CHECK(analyze(test::slurp(f)).graph_hash == pinned.at(f.filename().string()));
  }
}

TEST_CASE("the explain dump is exactly what was hashed and holds no debug information", "[hlo]") {
  std::string bytes = test::slurp(test::k_corpus / "spu_credit_fraud_metrics_test.hlo.pb");
  std::string dump;
  auto a = analyze(bytes, &dump);
  CHECK(dump.rfind("neffcache canonical hlo v1\n", 0) == 0);
  auto sha = detail::Digest::sha256();
  sha.update(dump);
  CHECK(sha.hex() == a.canonical_sha256);
  // The metadata of this file holds python3.8 site-packages paths; names hold TF's
  // function-instance counters. Neither may reach the canonical form.
  CHECK(bytes.find("site-packages") != std::string::npos);
  CHECK(dump.find("site-packages") == std::string::npos);
  CHECK(dump.find("a_inference") == std::string::npos);
  CHECK(dump.find("opcode \"parameter\"") != std::string::npos);
}

TEST_CASE("an HloProto hashes like the HloModuleProto it wraps", "[hlo]") {
  int wrappers = 0;
  for (const auto& f : test::corpus_files()) {
    std::string bytes = test::slurp(f);
    auto a = analyze(bytes);
    if (a.stats.format != HloFormat::hlo_proto) continue;
    ++wrappers;
    neffcache_test::HloProto proto;
    REQUIRE(proto.ParseFromString(bytes));
    auto inner = analyze(proto.hlo_module().SerializeAsString());
    INFO(f.filename());
    CHECK(inner.stats.format == HloFormat::hlo_module);
    CHECK(inner.graph_hash == a.graph_hash);
  }
  CHECK(wrappers >= 15);
}

TEST_CASE("framework operators are counted from the instructions' metadata", "[hlo]") {
  // The generated parser of the test schema is the reference: op_type of every
  // instruction that has one.
  int with_metadata = 0;
  for (const auto& f : test::corpus_files()) {
    std::string bytes = test::slurp(f);
    auto a = analyze(bytes);
    neffcache_test::HloProto wrapper;
    neffcache_test::HloModuleProto module;
    if (a.stats.format == HloFormat::hlo_proto) {
      REQUIRE(wrapper.ParseFromString(bytes));
      module = wrapper.hlo_module();
    } else {
      REQUIRE(module.ParseFromString(bytes));
    }
    std::map<std::string, uint64_t, std::less<>> expected;
    for (const auto& c : module.computations())
      for (const auto& i : c.instructions())
        if (!i.metadata().op_type().empty()) ++expected[i.metadata().op_type()];
    INFO(f.filename());
    CHECK(a.stats.framework_ops == expected);
    if (!expected.empty()) ++with_metadata;
  }
  CHECK(with_metadata >= 5);  // the TF and JAX graphs of the SPU corpus carry metadata
}

TEST_CASE("packed and unpacked encodings of a repeated field hash the same", "[hlo]") {
  // A one-instruction module written by hand, with shape dimensions [2, 3] encoded
  // packed in one variant and as two separate varints in the other.
  auto module = [](bool packed) {
    std::string shape, instr, comp, mod;
    {
      google::protobuf::io::StringOutputStream s(&shape);
      google::protobuf::io::CodedOutputStream o(&s);
      o.WriteTag(2 << 3 | 0), o.WriteVarint32(11);  // element_type F32
      if (packed) {
        o.WriteTag(3 << 3 | 2), o.WriteVarint32(2), o.WriteVarint32(2), o.WriteVarint32(3);
      } else {
        o.WriteTag(3 << 3 | 0), o.WriteVarint32(2);
        o.WriteTag(3 << 3 | 0), o.WriteVarint32(3);
      }
    }
    auto add_bytes = [](std::string& into, uint32_t field, const std::string& payload) {
      google::protobuf::io::StringOutputStream s(&into);
      google::protobuf::io::CodedOutputStream o(&s);
      o.WriteTag(field << 3 | 2);
      o.WriteVarint32(static_cast<uint32_t>(payload.size()));
      o.WriteString(payload);
    };
    add_bytes(instr, 2, "parameter");
    add_bytes(instr, 3, shape);
    add_bytes(comp, 2, instr);
    add_bytes(mod, 3, comp);
    return mod;
  };
  auto a = analyze(module(true));
  auto b = analyze(module(false));
  CHECK(a.stats.instructions == 1);
  CHECK(a.graph_hash == b.graph_hash);
}
