// One pass over serialized HLO with protobuf's wire decoder: validates the structure,
// collects statistics and writes the canonical text that the graph hash is taken of.
#pragma once

#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <google/protobuf/io/coded_stream.h>

#include <neffcache/hlo/detail/nki.hpp>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/digest.hpp>
#include <neffcache/hlo/detail/schema.hpp>

namespace neffcache::detail::hlo {

// Deepest message nesting accepted. Real modules nest about 8 deep (tuple shapes in
// literals); the bound keeps hostile input from exhausting the stack.
inline constexpr int k_max_depth = 64;
// Canonical text is handed to the sink in pieces of about this size.
inline constexpr std::size_t k_flush_bytes = 1 << 20;

struct Stats {
  uint64_t computations = 0;
  uint64_t instructions = 0;
  uint64_t entry_parameters = 0;
  std::map<std::string, uint64_t, std::less<>> opcodes;
  // Framework operator (OpMetadata.op_type: an aten op for PyTorch, a primitive for JAX)
  // -> instructions it produced. Not part of the canonical text.
  std::map<std::string, uint64_t, std::less<>> framework_ops;
  // The NKI kernel binaries its instructions call by path (nki.hpp). Not part of the
  // canonical text beyond the backend_config that names them.
  std::set<std::string> kernel_files;
};

class Canonicalizer {
 public:
  using Sink = std::function<void(std::string_view)>;

  Canonicalizer(std::string_view bytes, Sink sink);

  // Walks the whole input as `top` (Msg::hlo_proto or Msg::module). On false, error()
  // says what is wrong and where; the sink may have received a prefix of the text.
  bool run(Msg top);

  const Stats& stats() const { return stats_; }
  const std::string& error() const { return error_; }
  int error_offset() const { return error_offset_; }

 private:
  // A run of consecutive occurrences of one field in a message that prints as one unit:
  // a list (packed and unpacked encodings merge) or a set of map entries (sorted, since
  // map order on the wire depends on the serializer, not on the graph).
  struct Group {
    uint32_t field = 0;
    bool is_map = false;
    std::vector<std::string> entries;
  };

  struct Computation {
    uint64_t old_id = 0;
    bool has_id = false;
    uint64_t parameters = 0;
  };

  bool fail(std::string what);
  // Prefixes the field path while a failure unwinds: "computations.instructions.shape".
  bool fail_in(const char* field);

  void indent(int depth) { out_.append(static_cast<std::size_t>(depth) * 2, ' '); }
  void open_line(int depth, const Field* f, uint32_t number);

  void append_hex(const uint8_t* p, std::size_t n);

  // Appends `text` in double quotes; quote, backslash and every byte outside printable
  // ASCII are escaped, so the result is one line whatever the bytes.
  static void append_quoted(std::string& out, std::string_view text);

  void close_group(Group& g);
  void flush();

  uint64_t renumber(std::unordered_map<uint64_t, uint64_t>& map, uint64_t id) {
    return map.try_emplace(id, map.size()).first->second;
  }

  void append_int(int64_t v);
  void append_id(Kind kind, uint64_t v);

  // Reads the length of a length-delimited field and checks it fits what is left.
  bool read_length(int& len);

  bool skip_field(int wire_type);

  // A repeated integer field (ints or ids), one element (wire type 0) or packed (2).
  bool read_list(Group& g, const Field& f, int wire_type, int depth);

  bool read_raw(const Field* f, uint32_t number, int wire_type, int depth);

  // The opcode is the one field that tells HLO from other protobuf data: a short
  // lower-case token such as "add" or "get-tuple-element".
  static bool plausible_opcode(std::string_view s);

  // Field order carries no meaning in protobuf, and tools that round-trip a module
  // through an older schema move unknown fields to the end. So a message whose fields
  // are not in ascending order is walked from a copy re-laid in stable field-number
  // order (repeated fields keep their order). Serializers write ascending order, so
  // the common case costs one scan of the tags.
  bool walk(Msg type, int depth);

  // Scans the fields up to the current limit without consuming them. When they are
  // out of order, fills `relaid` with them in stable field-number order, consumes the
  // message from in_ and returns true. Malformed data is left for walk_fields to report.
  bool relay_if_unordered(std::string& relaid);

  bool walk_fields(Msg type, int depth);
  void record_opcode(std::string_view op);

  // Counts the op_type (field 1) of an instruction's OpMetadata, then skips it. The
  // metadata is not part of the canonical form, so a malformed one is ignored, not an error.
  bool record_framework_op();

  // The entry computation is the one named by entry_computation_id, else the last
  // one (callees come first in XLA's order).
  void finish_module(std::size_t first);

  struct Span {
    uint32_t number;
    int begin, end;
  };
  std::vector<Span> spans_;
  const uint8_t* data_;  // start of the buffer in_ reads
  google::protobuf::io::CodedInputStream stream_;
  google::protobuf::io::CodedInputStream* in_ = &stream_;
  Sink sink_;
  std::string out_;
  int capturing_ = 0;
  std::unordered_map<uint64_t, uint64_t> instr_ids_, comp_ids_;
  std::vector<Computation> comps_;
  uint64_t entry_id_ = 0;
  bool has_entry_id_ = false;
  int modules_ = 0;
  Stats stats_;
  std::string error_;
  int error_offset_ = -1;
};

}  // namespace neffcache::detail::hlo

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/hlo/detail/canon.ipp>
#endif
