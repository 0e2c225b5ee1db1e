// Graph variants built with the test-only HLO subset: what must and must not change
// the canonical graph hash, over every corpus file.
#include <functional>
#include <map>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/hlo/hlo.hpp>

#include "hlo_subset.pb.h"
#include "hlo_variants.hpp"
#include "support.hpp"

using namespace neffcache;
using neffcache_test::HloModuleProto;
using test::Graph;
using test::change_debug_info_and_ids;

namespace {

std::string graph_hash(const std::string& bytes) {
  auto a = analyze_hlo(bytes);
  INFO((a ? "" : a.error().message));
  REQUIRE(a.has_value());
  return a->graph_hash;
}

using Mutation = std::function<bool(HloModuleProto&)>;  // false: not applicable here

// One semantic change each; every one of them must move the hash.
const std::map<std::string, Mutation>& semantic_mutations() {
  static const std::map<std::string, Mutation> m{
      {"opcode",
       [](HloModuleProto& m) {
         auto* ins = m.mutable_computations()->rbegin()->mutable_instructions()->rbegin().operator->();
         ins->set_opcode(ins->opcode() == "negate" ? "abs" : "negate");
         return true;
       }},
      {"shape dimension",
       [](HloModuleProto& m) {
         for (auto& comp : *m.mutable_computations())
           for (auto& ins : *comp.mutable_instructions())
             if (ins.shape().dimensions_size() > 0) {
               ins.mutable_shape()->set_dimensions(0, ins.shape().dimensions(0) + 1);
               return true;
             }
         return false;
       }},
      {"literal byte",
       [](HloModuleProto& m) {
         for (auto& comp : *m.mutable_computations())
           for (auto& ins : *comp.mutable_instructions()) {
             if (!ins.has_literal()) continue;
             auto* l = ins.mutable_literal();
             auto flip = [](std::string* s) { (*s)[0] = static_cast<char>((*s)[0] ^ 1); };
             if (l->f32s_size()) l->set_f32s(0, l->f32s(0) + 1.0f);
             else if (l->s32s_size()) l->set_s32s(0, l->s32s(0) ^ 1);
             else if (l->u32s_size()) l->set_u32s(0, l->u32s(0) ^ 1);
             else if (l->s64s_size()) l->set_s64s(0, l->s64s(0) ^ 1);
             else if (l->u64s_size()) l->set_u64s(0, l->u64s(0) ^ 1);
             else if (l->f64s_size()) l->set_f64s(0, l->f64s(0) + 1.0);
             else if (l->preds_size()) l->set_preds(0, !l->preds(0));
             else if (!l->u8s().empty()) flip(l->mutable_u8s());
             else if (!l->bf16s().empty()) flip(l->mutable_bf16s());
             else if (!l->f16s().empty()) flip(l->mutable_f16s());
             else if (!l->s8s().empty()) flip(l->mutable_s8s());
             else continue;
             return true;
           }
         return false;
       }},
      {"operand",
       [](HloModuleProto& m) {
         for (auto& comp : *m.mutable_computations()) {
           for (auto& ins : *comp.mutable_instructions()) {
             auto* ops = ins.mutable_operand_ids();
             if (ops->size() >= 2 && ops->Get(0) != ops->Get(1)) {
               ops->SwapElements(0, 1);
               return true;
             }
           }
           // Otherwise rewire a single-operand instruction to another earlier value.
           for (int i = 1; i < comp.instructions_size(); ++i) {
             auto* ins = comp.mutable_instructions(i);
             if (ins->operand_ids_size() != 1) continue;
             for (int j = 0; j < i; ++j)
               if (comp.instructions(j).id() != ins->operand_ids(0)) {
                 ins->set_operand_ids(0, comp.instructions(j).id());
                 return true;
               }
           }
         }
         return false;
       }},
      {"called computation",
       [](HloModuleProto& m) {
         for (auto& comp : *m.mutable_computations())
           for (auto& ins : *comp.mutable_instructions())
             if (ins.called_computation_ids_size() > 0)
               for (const auto& other : m.computations())
                 if (other.id() != ins.called_computation_ids(0)) {
                   ins.set_called_computation_ids(0, other.id());
                   return true;
                 }
         return false;
       }},
  };
  return m;
}

}  // namespace

TEST_CASE("changing only debug information and ids keeps the graph hash", "[hlo][variants]") {
  for (const auto& f : test::corpus_files()) {
    INFO(f.filename());
    std::string original = test::slurp(f);
    Graph g = Graph::load(original);
    change_debug_info_and_ids(g.module);
    std::string variant = g.serialize();
    REQUIRE(variant != original);
    CHECK(graph_hash(variant) == graph_hash(original));
  }
}

TEST_CASE("one semantic change moves the graph hash", "[hlo][variants]") {
  std::map<std::string, int> applied;
  auto files = test::corpus_files();
  for (const auto& f : files) {
    std::string original = test::slurp(f);
    std::string original_hash = graph_hash(original);
    for (const auto& [what, mutate] : semantic_mutations()) {
      INFO(f.filename() << ": " << what);
      Graph g = Graph::load(original);
      if (!mutate(g.module)) continue;
      ++applied[what];
      CHECK(graph_hash(g.serialize()) != original_hash);
      // The same change on top of renamed, renumbered debug info is still a change.
      change_debug_info_and_ids(g.module);
      CHECK(graph_hash(g.serialize()) != original_hash);
    }
  }
  // Each kind of change is exercised on a good part of the corpus.
  CHECK(applied["opcode"] == static_cast<int>(files.size()));
  CHECK(applied["shape dimension"] >= 20);  // five corpus files hold only scalars
  CHECK(applied["operand"] >= 20);
  CHECK(applied["literal byte"] >= 15);
  CHECK(applied["called computation"] >= 10);
}
