// Variants of a serialized HLO module made with the test-only HLO subset: the same graph
// with other debug information (names, metadata, ids), or one opcode changed. Used by
// the canonical-hash tests and by the content-index tests, which need twins, and by the
// benchmarks (so no Catch2 here: what cannot be read throws).
#pragma once

#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include <neffcache/hlo/hlo.hpp>

#include "hlo_subset.pb.h"

namespace test {

using neffcache_test::HloModuleProto;

// A corpus file as a mutable module, re-serialized in its own format.
struct Graph {
  bool wrapped = false;
  neffcache_test::HloProto wrapper;
  HloModuleProto module;

  static Graph load(const std::string& bytes) {
    Graph g;
    auto a = neffcache::analyze_hlo(bytes);
    if (!a) throw std::runtime_error("not HLO: " + a.error().message);
    g.wrapped = a->stats.format == neffcache::HloFormat::hlo_proto;
    if (g.wrapped) {
      if (!g.wrapper.ParseFromString(bytes)) throw std::runtime_error("not an HloProto");
      g.module = g.wrapper.hlo_module();
    } else {
      if (!g.module.ParseFromString(bytes)) throw std::runtime_error("not an HloModuleProto");
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

// Bijections on 64-bit ids that keep 0 (proto3's "absent") at 0 and send every other
// id far above 32 bits: multiplication by an odd constant modulo 2^64.
inline int64_t new_instr_id(int64_t id) { return static_cast<int64_t>(static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull); }
inline int64_t new_comp_id(int64_t id) { return static_cast<int64_t>(static_cast<uint64_t>(id) * 0xC2B2AE3D27D4EB4Full); }

inline void remap(google::protobuf::RepeatedField<int64_t>* ids, int64_t (*f)(int64_t)) {
  for (auto& id : *ids) id = f(id);
}

// Everything the canonical form must ignore: names, metadata, stack frames,
// statistics, the module id, and the numbering of instructions and computations.
inline void change_debug_info_and_ids(HloModuleProto& m) {
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

// The same graph as `bytes` with every debug-only field and id changed: a metadata twin.
inline std::string debug_variant(const std::string& bytes) {
  Graph g = Graph::load(bytes);
  change_debug_info_and_ids(g.module);
  return g.serialize();
}

// `bytes` with the opcode of its last instruction changed: another graph.
inline std::string opcode_variant(const std::string& bytes) {
  Graph g = Graph::load(bytes);
  auto* ins = g.module.mutable_computations()->rbegin()->mutable_instructions()->rbegin().operator->();
  ins->set_opcode(ins->opcode() == "negate" ? "abs" : "negate");
  return g.serialize();
}

}  // namespace test
