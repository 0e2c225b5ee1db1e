// Reading serialized XLA HLO (HloModuleProto, or the HloProto wrapper that XLA dumps
// and profilers write) with protobuf's wire decoder, no generated code: statistics and
// the canonical graph hash that keys the cache.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>

#include <neffcache/core/decl.hpp>
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
NEFFCACHE_DECL Result<HloAnalysis> analyze_hlo(std::string_view bytes, const CanonicalSink& dump = {});

// analyze_hlo over a file's content; the path is named in every error.
NEFFCACHE_DECL Result<HloAnalysis> analyze_hlo_file(const std::string& path, const CanonicalSink& dump = {});

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/hlo/hlo.ipp>
#endif
