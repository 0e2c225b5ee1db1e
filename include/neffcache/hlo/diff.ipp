// Definitions of hlo/diff.hpp (core/decl.hpp).
#pragma once

#include <neffcache/hlo/diff.hpp>

#include <algorithm>
#include <charconv>
#include <iterator>
#include <tuple>
#include <unordered_map>

#include <fmt/format.h>

namespace neffcache {

namespace detail {

NEFFCACHE_DECL std::string relative_ids(std::string_view unit, int64_t own) {
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

NEFFCACHE_DECL void HloUnitSplitter::feed(std::string_view piece) {
  for (std::size_t nl; (nl = piece.find('\n')) != std::string_view::npos; piece.remove_prefix(nl + 1)) {
    partial_.append(piece.substr(0, nl));
    line(partial_);
    partial_.clear();
  }
  partial_.append(piece);
}

NEFFCACHE_DECL void HloUnitSplitter::line(std::string_view l) {
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

NEFFCACHE_DECL void HloUnitSplitter::close_block() {
  if (!instruction_) units_.other.push_back(std::move(block_));
  else if (has_own_id_) units_.instructions.push_back(detail::relative_ids(block_, own_id_));
  else units_.instructions.push_back(std::move(block_));  // no id (proto3's 0): as written
  block_.clear();
  block_indent_ = -1;
}

NEFFCACHE_DECL Result<HloSplit> split_hlo(std::string_view bytes) {
  HloUnitSplitter splitter;
  auto a = analyze_hlo(bytes, [&](std::string_view piece) { splitter.feed(piece); });
  if (!a) return a.error();
  return HloSplit{std::move(*a), splitter.finish()};
}

namespace detail {

NEFFCACHE_DECL std::string shown_unit(std::string_view unit) {
  if (unit.size() <= k_diff_shown_chars) return std::string(unit);
  return fmt::format("{}...", unit.substr(0, k_diff_shown_chars));
}

NEFFCACHE_DECL std::pair<std::string, std::string> shown_pair(std::string_view cached, std::string_view asked) {
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

NEFFCACHE_DECL void count_hunk(HloDiff& d, std::size_t removed, std::size_t added) {
  std::size_t paired = std::min(removed, added);
  d.changed += paired;
  d.removed += removed - paired;
  d.added += added - paired;
}

}  // namespace detail

NEFFCACHE_DECL HloDiff diff_units(const std::vector<std::string>& cached, const std::vector<std::string>& asked) {
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

NEFFCACHE_DECL HloDiff diff_hlo_units(const HloUnits& cached, const HloUnits& asked) {
  HloDiff d = diff_units(cached.instructions, asked.instructions);
  if (!d.equal()) return d;
  d = diff_units(cached.other, asked.other);
  d.of_instructions = false;
  return d;
}

}  // namespace neffcache
