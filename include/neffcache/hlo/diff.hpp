// Comparing two graphs by their canonical text (hlo.hpp): how many instructions one has
// that the other lacks, how many changed, and the first that differ, so that a cache miss
// can say how the graph asked for differs from the nearest cached one.
//
// Each graph is split into units: one per instruction (its block of the canonical text
// on one line, its own id left out and the ids it refers to written relative to it, so
// that an inserted instruction does not make every later one differ), and one per other
// field of a computation or of the module (program shapes, root, entry computation).
#pragma once

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <string>
#include <string_view>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

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
inline std::string relative_ids(std::string_view unit, int64_t own) {
  std::string out;
  out.reserve(unit.size());
  bool quoted = false;
  for (std::size_t i = 0; i < unit.size(); ++i) {
    char c = unit[i];
    if (quoted) {
      out += c;
      if (c == '\\' && i + 1 < unit.size()) out += unit[++i];
      else if (c == '"') quoted = false;
      continue;
    }
    if (c == '"') quoted = true;
    int64_t k = 0;
    auto [end, ec] = c == '%' ? std::from_chars(unit.data() + i + 1, unit.data() + unit.size(), k)
                              : std::from_chars_result{nullptr, std::errc::invalid_argument};
    if (ec != std::errc()) {
      out += c;
      continue;
    }
    fmt::format_to(std::back_inserter(out), "^{}", own - k);
    i = static_cast<std::size_t>(end - unit.data()) - 1;
  }
  return out;
}

}  // namespace detail

// Splits canonical text, given in pieces as a CanonicalSink receives it, into units.
class HloUnitSplitter {
 public:
  void feed(std::string_view piece) {
    for (std::size_t nl; (nl = piece.find('\n')) != std::string_view::npos; piece.remove_prefix(nl + 1)) {
      partial_.append(piece.substr(0, nl));
      line(partial_);
      partial_.clear();
    }
    partial_.append(piece);
  }
  // The units of everything fed (an unfinished last line or block is kept as it is).
  HloUnits finish() {
    if (!partial_.empty()) line(partial_), partial_.clear();
    if (block_indent_ >= 0) close_block();
    return std::move(units_);
  }

 private:
  void line(std::string_view l) {
    const std::size_t indent = std::min(l.find_first_not_of(' '), l.size());
    std::string_view text = l.substr(indent);
    if (block_indent_ >= 0) {
      // The instruction's own id, directly inside its block, is left out.
      if (instruction_ && indent == static_cast<std::size_t>(block_indent_) + 2 && text.starts_with("id %")) {
        std::from_chars(text.data() + 4, text.data() + text.size(), own_id_);
        has_own_id_ = true;
        return;
      }
      block_ += ' ';
      block_.append(text);
      if (indent == static_cast<std::size_t>(block_indent_) && text == "}") close_block();
      return;
    }
    // The computations' own braces only group their fields.
    if ((indent == 0 && text == "computations {") || text == "}") return;
    if (text.ends_with(" {")) {
      block_indent_ = static_cast<int>(indent);
      instruction_ = indent == 2 && text == "instructions {";
      has_own_id_ = false;
      block_.assign(text);
      return;
    }
    units_.other.emplace_back(text);
  }

  void close_block() {
    if (!instruction_) units_.other.push_back(std::move(block_));
    else if (has_own_id_) units_.instructions.push_back(detail::relative_ids(block_, own_id_));
    else units_.instructions.push_back(std::move(block_));  // no id (proto3's 0): as written
    block_.clear();
    block_indent_ = -1;
  }

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
inline Result<HloSplit> split_hlo(std::string_view bytes) {
  HloUnitSplitter splitter;
  auto a = analyze_hlo(bytes, [&](std::string_view piece) { splitter.feed(piece); });
  if (!a) return a.error();
  return HloSplit{std::move(*a), splitter.finish()};
}

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

inline std::string shown_unit(std::string_view unit) {
  if (unit.size() <= k_diff_shown_chars) return std::string(unit);
  return fmt::format("{}...", unit.substr(0, k_diff_shown_chars));
}

// The first differing units of both sides as shown. When they agree on more than fits,
// each keeps its head (an instruction's opcode) and then shows from a little before the
// first character where they differ, so that the difference is in view.
inline std::pair<std::string, std::string> shown_pair(std::string_view cached, std::string_view asked) {
  constexpr std::size_t head = 48, before = 40;
  const std::size_t common = static_cast<std::size_t>(
      std::mismatch(cached.begin(), cached.end(), asked.begin(), asked.end()).first -
      cached.begin());
  if (cached.empty() || asked.empty() || common + before <= k_diff_shown_chars)
    return {shown_unit(cached), shown_unit(asked)};
  auto cut = [&](std::string_view unit) {
    return shown_unit(fmt::format("{} ... {}", unit.substr(0, head), unit.substr(common - before)));
  };
  return {cut(cached), cut(asked)};
}

// Counts a run of `removed` units and `added` units between two common ones; a removed
// unit paired with an added one counts as changed.
inline void count_hunk(HloDiff& d, std::size_t removed, std::size_t added) {
  std::size_t paired = std::min(removed, added);
  d.changed += paired;
  d.removed += removed - paired;
  d.added += added - paired;
}

}  // namespace detail

// Compares two unit sequences: the common prefix and suffix are trimmed; what is left is
// diffed by longest common subsequence when both sides are under k_diff_lcs_limit, else
// counted as multisets (units common to both, wherever they are, are not differences).
inline HloDiff diff_units(const std::vector<std::string>& cached, const std::vector<std::string>& asked) {
  HloDiff d;
  std::size_t begin = 0, end_c = cached.size(), end_a = asked.size();
  while (begin < end_c && begin < end_a && cached[begin] == asked[begin]) ++begin;
  while (end_c > begin && end_a > begin && cached[end_c - 1] == asked[end_a - 1]) --end_c, --end_a;
  const std::size_t n = end_c - begin, m = end_a - begin;
  if (n == 0 && m == 0) return d;
  auto hashes = [&](const std::vector<std::string>& units, std::size_t count) {
    std::vector<uint64_t> out(count);
    for (std::size_t i = 0; i < count; ++i) {
      detail::Xxh3 h;
      h.update(units[begin + i].data(), units[begin + i].size());
      out[i] = h.digest();
    }
    return out;
  };
  const auto a = hashes(cached, n), b = hashes(asked, m);

  if (n >= k_diff_lcs_limit || m >= k_diff_lcs_limit) {
    std::unordered_map<uint64_t, int64_t> count;
    for (auto h : a) ++count[h];
    std::size_t common = 0;
    for (auto h : b)
      if (auto it = count.find(h); it != count.end() && it->second > 0) --it->second, ++common;
    detail::count_hunk(d, n - common, m - common);
    std::tie(d.first_cached, d.first_asked) = detail::shown_pair(cached[begin], asked[begin]);
    return d;
  }

  // step[i * m + j]: the first move of a longest common subsequence of a[i..] and b[j..]
  // (1: a common unit, 2: skip a[i], a removal, 3: skip b[j], an addition). Ties prefer
  // the removal, so that a replaced unit reads as removed then added: one change.
  std::vector<uint8_t> step(n * m);
  std::vector<uint32_t> next(m + 1, 0), cur(m + 1, 0);
  for (std::size_t i = n; i-- > 0;) {
    cur[m] = 0;
    for (std::size_t j = m; j-- > 0;) {
      if (a[i] == b[j]) cur[j] = next[j + 1] + 1, step[i * m + j] = 1;
      else if (next[j] >= cur[j + 1]) cur[j] = next[j], step[i * m + j] = 2;
      else cur[j] = cur[j + 1], step[i * m + j] = 3;
    }
    std::swap(next, cur);
  }
  std::size_t i = 0, j = 0, removed = 0, added = 0;
  bool first = true;
  auto close = [&] {
    if (removed == 0 && added == 0) return;
    if (first) {
      std::tie(d.first_cached, d.first_asked) =
          detail::shown_pair(removed ? std::string_view(cached[begin + i - removed]) : std::string_view(),
                             added ? std::string_view(asked[begin + j - added]) : std::string_view());
      first = false;
    }
    detail::count_hunk(d, removed, added);
    removed = added = 0;
  };
  while (i < n || j < m) {
    uint8_t s = i == n ? 3 : j == m ? 2 : step[i * m + j];
    if (s == 1) close(), ++i, ++j;
    else if (s == 2) ++removed, ++i;
    else ++added, ++j;
  }
  close();
  return d;
}

// Compares two graphs' instructions; when those are equal, their other fields instead,
// so that two different graphs with equal instructions still show what differs.
inline HloDiff diff_hlo_units(const HloUnits& cached, const HloUnits& asked) {
  HloDiff d = diff_units(cached.instructions, asked.instructions);
  if (!d.equal()) return d;
  d = diff_units(cached.other, asked.other);
  d.of_instructions = false;
  return d;
}

}  // namespace neffcache
