// Comparing two graphs by their canonical text (hlo.hpp): how many instructions one has
// that the other lacks, how many changed, and the first that differ, so that a cache miss
// can say how the graph asked for differs from the nearest cached one.
//
// Each graph is split into units: one per instruction (its block of the canonical text
// on one line, its own id left out and the ids it refers to written relative to it, so
// that an inserted instruction does not make every later one differ), and one per other
// field of a computation or of the module (program shapes, root, entry computation).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/xxh3.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/hlo/hlo.hpp>

namespace neffcache {

// Below this many differing units on both sides (after the common prefix and suffix are
// trimmed) the comparison is a true longest-common-subsequence diff, which needs a byte
// per pair of units; above it, units are counted as multisets.
inline constexpr std::size_t k_diff_lcs_limit = 4000;
// A unit shown as a first difference is cut to this many characters.
inline constexpr std::size_t k_diff_shown_chars = 200;

// A graph split for comparison.
struct HloUnits {
  std::vector<std::string> instructions;  // in the order of the canonical text
  std::vector<std::string> other;         // every other field, each on one line
};

namespace detail {

// Rewrites an instruction unit's ids: "%K" becomes "^D" with D = own - K (how far back
// the referenced instruction is). Quoted strings are left as they are.
NEFFCACHE_DECL std::string relative_ids(std::string_view unit, int64_t own);

}  // namespace detail

// Splits canonical text, given in pieces as a CanonicalSink receives it, into units.
class HloUnitSplitter {
 public:
  void feed(std::string_view piece);
  // The units of everything fed (an unfinished last line or block is kept as it is).
  HloUnits finish() {
    if (!partial_.empty()) line(partial_), partial_.clear();
    if (block_indent_ >= 0) close_block();
    return std::move(units_);
  }

 private:
  void line(std::string_view l);

  void close_block();

  std::string partial_;  // the line not yet ended
  std::string block_;    // the open block, on one line
  int block_indent_ = -1;  // indent of the open block's first line; -1: none open
  bool instruction_ = false;
  bool has_own_id_ = false;
  int64_t own_id_ = 0;
  HloUnits units_;
};

// A graph read for comparison: its analysis (hlo.hpp) and its units.
struct HloSplit {
  HloAnalysis analysis;
  HloUnits units;
};

// Reads serialized HLO as analyze_hlo does (same errors) and splits its canonical text.
NEFFCACHE_DECL Result<HloSplit> split_hlo(std::string_view bytes);

// How the graph asked for differs from a cached one.
struct HloDiff {
  std::size_t added = 0;    // units only the asked graph has
  std::size_t removed = 0;  // units only the cached graph has
  std::size_t changed = 0;  // a removed unit and an added one in the same place
  // Whether the counts are of instructions; false when the instructions are equal and
  // the counts are of the other fields (or nothing differs).
  bool of_instructions = true;
  // The first differing unit of each side, cut to k_diff_shown_chars; empty for a side
  // that has nothing there (a pure insertion or removal).
  std::string first_cached, first_asked;

  bool equal() const { return added == 0 && removed == 0 && changed == 0; }
};

namespace detail {

NEFFCACHE_DECL std::string shown_unit(std::string_view unit);

// The first differing units of both sides as shown. When they agree on more than fits,
// each keeps its head (an instruction's opcode) and then shows from a little before the
// first character where they differ, so that the difference is in view.
NEFFCACHE_DECL std::pair<std::string, std::string> shown_pair(std::string_view cached, std::string_view asked);

// Counts a run of `removed` units and `added` units between two common ones; a removed
// unit paired with an added one counts as changed.
NEFFCACHE_DECL void count_hunk(HloDiff& d, std::size_t removed, std::size_t added);

}  // namespace detail

// Compares two unit sequences: the common prefix and suffix are trimmed; what is left is
// diffed by longest common subsequence when both sides are under k_diff_lcs_limit, else
// counted as multisets (units common to both, wherever they are, are not differences).
NEFFCACHE_DECL HloDiff diff_units(const std::vector<std::string>& cached, const std::vector<std::string>& asked);

// Compares two graphs' instructions; when those are equal, their other fields instead,
// so that two different graphs with equal instructions still show what differs.
NEFFCACHE_DECL HloDiff diff_hlo_units(const HloUnits& cached, const HloUnits& asked);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/hlo/diff.ipp>
#endif
