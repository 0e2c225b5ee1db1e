// Reading serialized XLA HLO (HloModuleProto, or the HloProto wrapper that XLA dumps
// and profilers write) with protobuf's wire decoder, no generated code: statistics and
// the canonical graph hash that keys the cache.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include <neffcache/core/detail/digest.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/hlo/detail/canon.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

// Version of the canonical form. It is the first line of the canonical text, so any
// change to the form changes every graph hash instead of silently colliding.
inline constexpr int k_canonical_version = 1;
// Hex digits of SHA-256 kept in the graph hash, as the Neuron cache's MODULE_ names.
inline constexpr std::size_t k_graph_hash_digits = 20;

enum class HloFormat { hlo_module, hlo_proto };

inline const char* to_string(HloFormat f) {
  return f == HloFormat::hlo_module ? "HloModuleProto" : "HloProto";
}

struct HloStats {
  HloFormat format = HloFormat::hlo_module;
  uint64_t bytes = 0;
  uint64_t computations = 0;
  uint64_t instructions = 0;
  uint64_t entry_parameters = 0;  // parameter instructions of the entry computation
  std::map<std::string, uint64_t, std::less<>> opcodes;  // opcode -> instructions
  // Framework operator that produced the instructions (the op_type of their metadata:
  // an aten op for PyTorch/XLA, a primitive for JAX) -> instructions. Instructions
  // without metadata are not counted.
  std::map<std::string, uint64_t, std::less<>> framework_ops;
  // NKI kernel binaries the graph calls by absolute path (hlo/detail/nki.hpp): files the
  // compiler reads besides the HLO.
  std::set<std::string> kernel_files;
};

struct HloAnalysis {
  HloStats stats;
  std::string graph_hash;  // first k_graph_hash_digits hex digits of canonical_sha256
  std::string canonical_sha256;
};

// Receives the canonical text in order, in pieces; the concatenation is exactly the
// input of the hash (so `sha256sum` of a dump reproduces the graph hash).
using CanonicalSink = std::function<void(std::string_view)>;

// Reads `bytes` as an HloProto or an HloModuleProto (whichever parses as a module with
// computations and opcodes) and computes its statistics and canonical graph hash.
// Canonical form: ids renumbered in order of appearance (instruction and computation
// ids separately), names, metadata, stack frames, statistics and the module id left
// out, map entries sorted, everything else kept, every field named and delimited.
// Bytes that are not HLO, truncated or too deeply nested give Errc::bad_hlo with the
// reason and byte offset; no input reads out of bounds. `dump`, when given, receives
// the exact canonical text (a failed read may have sent a prefix).
inline Result<HloAnalysis> analyze_hlo(std::string_view bytes, const CanonicalSink& dump = {}) {
  using namespace detail::hlo;
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    return Error{Errc::bad_hlo, fmt::format("HLO of {} bytes is larger than 2 GiB", bytes.size())};
  if (bytes.empty()) return Error{Errc::bad_hlo, "empty file, not an HLO module"};

  const std::string header = fmt::format("neffcache canonical hlo v{}\n", k_canonical_version);
  struct Attempt {
    bool ok = false;
    Stats stats;
    std::string sha256, error;
    int offset = -1;
  };
  auto attempt = [&](Msg top, bool emit) {
    auto sha = detail::Digest::sha256();
    auto send = [&](std::string_view piece) {
      sha.update(piece);
      if (emit && dump) dump(piece);
    };
    send(header);
    Canonicalizer c(bytes, send);
    Attempt a;
    a.ok = c.run(top);
    if (a.ok) a.stats = c.stats(), a.sha256 = sha.hex();
    else a.error = c.error(), a.offset = c.error_offset();
    return a;
  };

  // An HloProto's field 1 is the module; in a bare module field 1 is the name, which
  // never parses as a module with computations. Try the wrapper first, without
  // emitting text for a format that may be rejected; emit on a second pass if needed.
  HloFormat format = HloFormat::hlo_proto;
  Attempt a = attempt(Msg::hlo_proto, false);
  if (a.ok && dump) a = attempt(Msg::hlo_proto, true);
  if (!a.ok) {
    format = HloFormat::hlo_module;
    a = attempt(Msg::module, true);
    if (!a.ok)
      return Error{Errc::bad_hlo,
                   fmt::format("not a readable HLO module (at byte {}: {})", a.offset, a.error)};
  }

  HloAnalysis out;
  const auto& s = a.stats;
  out.stats.format = format;
  out.stats.bytes = bytes.size();
  out.stats.computations = s.computations;
  out.stats.instructions = s.instructions;
  out.stats.entry_parameters = s.entry_parameters;
  out.stats.opcodes = s.opcodes;
  out.stats.framework_ops = s.framework_ops;
  out.stats.kernel_files = s.kernel_files;
  out.canonical_sha256 = std::move(a.sha256);
  out.graph_hash = out.canonical_sha256.substr(0, k_graph_hash_digits);
  return out;
}

// analyze_hlo over a file's content; the path is named in every error.
inline Result<HloAnalysis> analyze_hlo_file(const std::string& path, const CanonicalSink& dump = {}) {
  auto bytes = detail::read_file(path);
  if (!bytes) return bytes.error();
  auto r = analyze_hlo(*bytes, dump);
  if (!r) return Error{r.error().code, fmt::format("{}: {}", path, r.error().message)};
  return r;
}

}  // namespace neffcache
