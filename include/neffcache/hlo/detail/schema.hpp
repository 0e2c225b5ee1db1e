// The part of XLA's HLO protobuf schema that the canonical hash needs to know, by field
// number (see shared/hlo-corpus/HLO_PROTO_FIELDS.md). A field missing from these
// tables is not ignored: it is hashed exactly as it is on the wire, so a new XLA field
// can only cause a miss, never a wrong hit. Changing any name or kind here changes
// the canonical text and so every key: bump k_canonical_version with it.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include <neffcache/core/decl.hpp>

namespace neffcache::detail::hlo {

enum class Kind : uint8_t {
  raw,            // kept, printed by wire type (varint, fixed, bytes as hex)
  drop,           // debug-only: left out of the canonical form
  message,        // a sub-message of type Field::msg
  inline_module,  // HloProto.hlo_module: the module's fields, printed without a wrapper
  map_entry,      // map entry of type Field::msg; a run of entries is sorted
  string,         // length-delimited text, printed quoted
  ints,           // repeated int64, packed or not, printed as one list
  instr_id,       // an instruction id, renumbered in order of appearance
  comp_id,        // a computation id, renumbered in order of appearance
  instr_ids,      // repeated instruction ids
  comp_ids,       // repeated computation ids
};

enum class Msg : uint8_t {
  hlo_proto, module, computation, instruction, shape, layout, program_shape, literal,
  op_sharding, named_sharding, schedule, schedule_entry, instruction_sequence,
  frontend_attributes, string_pair, count
};

struct Field {
  uint32_t number = 0;
  const char* name = nullptr;
  Kind kind = Kind::raw;
  Msg msg = Msg::count;
};

struct MessageSchema {
  std::vector<Field> by_number;  // index = field number; name == nullptr: not listed
  const Field* find(uint32_t number) const {
    if (number >= by_number.size() || !by_number[number].name) return nullptr;
    return &by_number[number];
  }
};

NEFFCACHE_DECL MessageSchema make_schema(std::initializer_list<Field> fields);

NEFFCACHE_DECL const MessageSchema& schema_of(Msg m);

}  // namespace neffcache::detail::hlo

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/hlo/detail/schema.ipp>
#endif
