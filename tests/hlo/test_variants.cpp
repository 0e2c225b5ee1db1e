// Graph variants built with the test-only HLO subset: what must and must not change
// the canonical graph hash, over every corpus file.
#include <functional>
#include <map>

#include <catch2/catch_test_macros.hpp>

#include <neffcache/hlo.hpp>

#include "hlo_subset.pb.h"
#include "support.hpp"

using namespace neffcache;
using neffcache_test::HloModuleProto;

namespace {

// A corpus file as a mutable module, re-serialized in its own format.
struct Graph {
  bool wrapped = false;
  neffcache_test::HloProto wrapper;
  HloModuleProto module;

  static Graph load(const std::string& bytes) {
    Graph g;
    auto a = analyze_hlo(bytes);
    REQUIRE(a.has_value());
    g.wrapped = a->stats.format == HloFormat::hlo_proto;
    if (g.wrapped) {
      REQUIRE(g.wrapper.ParseFromString(bytes));
      g.module = g.wrapper.hlo_module();
    } else {
      REQUIRE(g.module.ParseFromString(bytes));
    }
    return g;
  }
  std::string serialize() const {
    if (!wrapped) return module.SerializeAsString();
    auto w = wrapper;
    *w.mutable_hlo_module() = module;
    return w.SerializeAsString();
  }
};

std::string graph_hash(const std::string& bytes) {
  auto a = analyze_hlo(bytes);
  INFO((a ? "" : a.error().message));
  REQUIRE(a.has_value());
  return a->graph_hash;
}

// Bijections on 64-bit ids that keep 0 (proto3's "absent") at 0 and send every other
// id far above 32 bits: multiplication by an odd constant modulo 2^64.
int64_t new_instr_id(int64_t id) { return static_cast<int64_t>(static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull); }
int64_t new_comp_id(int64_t id) { return static_cast<int64_t>(static_cast<uint64_t>(id) * 0xC2B2AE3D27D4EB4Full); }

void remap(google::protobuf::RepeatedField<int64_t>* ids, int64_t (*f)(int64_t)) {
  for (auto& id : *ids) id = f(id);
}

// Everything the canonical form must ignore: names, metadata, stack frames,
// statistics, the module id, and the numbering of instructions and computations.
void change_debug_info_and_ids(HloModuleProto& m) {
  m.set_name("renamed_module.9999");
  m.set_entry_computation_name("renamed_entry.77");
  m.set_id(m.id() + 424242);
  m.mutable_stack_frame_index()->add_file_names("/home/someone-else/train.py");
  m.mutable_stack_frame_index()->add_function_names("<lambda>");
  for (auto& n : *m.mutable_host_program_shape()->mutable_parameter_names()) n = "renamed_" + n;
  m.set_entry_computation_id(new_comp_id(m.entry_computation_id()));
  int c = 0;
  for (auto& comp : *m.mutable_computations()) {
    comp.set_name(fmt::format("computation_{}.{}", c, 1000 + c));
    ++c;
    for (auto& n : *comp.mutable_program_shape()->mutable_parameter_names()) n = "arg_" + n;
    comp.set_id(new_comp_id(comp.id()));
    comp.set_root_id(new_instr_id(comp.root_id()));
    int i = 0;
    for (auto& ins : *comp.mutable_instructions()) {
      ins.set_name(fmt::format("{}.{}", ins.opcode(), 31337 + i++));
      auto* md = ins.mutable_metadata();
      md->set_op_name("jit(other)/renamed/" + ins.opcode());
      md->set_op_type("RenamedOp");
      md->set_source_file("/tmp/pytest-of-root/elsewhere.py");
      md->set_source_line(md->source_line() + 17);
      md->set_stack_frame_id(md->stack_frame_id() + 1);
      md->set_source_column(9);
      ins.mutable_statistics_viz()->set_stat_index_to_visualize(3);
      ins.set_id(new_instr_id(ins.id()));
      remap(ins.mutable_operand_ids(), new_instr_id);
      remap(ins.mutable_control_predecessor_ids(), new_instr_id);
      remap(ins.mutable_called_computation_ids(), new_comp_id);
    }
  }
  if (m.has_schedule()) {
    google::protobuf::Map<int64_t, neffcache_test::InstructionSequence> renumbered;
    for (const auto& [comp_id, seq] : m.schedule().sequences()) {
      auto& s = renumbered[new_comp_id(comp_id)];
      s = seq;
      remap(s.mutable_instruction_ids(), new_instr_id);
    }
    *m.mutable_schedule()->mutable_sequences() = renumbered;
  }
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
