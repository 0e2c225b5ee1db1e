// Definitions of compile/peaks.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/peaks.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

NEFFCACHE_DECL const char* to_string(PeakPrediction::Basis b) {
  switch (b) {
    case PeakPrediction::Basis::same_graph: return "same graph";
    case PeakPrediction::Basis::neighbours: return "nearest graphs";
    case PeakPrediction::Basis::unseen: return "never seen";
  }
  return "?";
}

NEFFCACHE_DECL void PeakHistory::add(const std::string& key, uint64_t instructions, uint64_t hlo_bytes,
                                     uint64_t peak_kib) {
  auto id = ContentId::parse(key);
  if (!id || peak_kib == 0) return;
  PeakSample s{id->graph_sha256, instructions, hlo_bytes, peak_kib};
  std::lock_guard lk(mu_);
  Group& g = load_locked(*id);
  g.samples.push_back(s);
  ++version_;
  if (dir_.empty()) return;
  const std::string line =
      nlohmann::json{{"sha256", s.graph_sha256}, {"instructions", s.instructions}, {"hlo_bytes", s.hlo_bytes},
                     {"peak_kib", s.peak_kib}}
          .dump() +
      "\n";
  const std::string path = file_of(*id);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  detail::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644));
  // One write: appended whole, never interleaved with another process's line.
  if (fd && ::write(fd.get(), line.data(), line.size()) == static_cast<ssize_t>(line.size())) g.read_to += line.size();
}

NEFFCACHE_DECL PeakPrediction PeakHistory::predict(const std::string& key, uint64_t instructions,
                                                   uint64_t hlo_bytes) {
  auto id = ContentId::parse(key);
  if (!id) return {unseen_, PeakPrediction::Basis::unseen};
  std::lock_guard lk(mu_);
  const auto& samples = load_locked(*id).samples;
  auto with_headroom = [](double kib) { return static_cast<uint64_t>(kib * k_peak_headroom * 1024.0); };
  uint64_t same = 0;
  for (const auto& s : samples)
    if (s.graph_sha256 == id->graph_sha256) same = std::max(same, s.peak_kib);
  if (same) return {with_headroom(static_cast<double>(same)), PeakPrediction::Basis::same_graph};
  // Sizes compared by instruction count, or by HLO bytes when either count is unknown.
  const bool by_count = instructions > 0;
  auto size_of = [&](const PeakSample& s) { return static_cast<double>(by_count ? s.instructions : s.hlo_bytes); };
  const double x = static_cast<double>(by_count ? instructions : hlo_bytes);
  const PeakSample *below = nullptr, *above = nullptr;
  for (const auto& s : samples) {
    double sx = size_of(s);
    if (sx <= 0) continue;
    // Nearest on each side; among equal sizes the larger peak.
    if (sx <= x && (!below || sx > size_of(*below) || (sx == size_of(*below) && s.peak_kib > below->peak_kib)))
      below = &s;
    if (sx >= x && (!above || sx < size_of(*above) || (sx == size_of(*above) && s.peak_kib > above->peak_kib)))
      above = &s;
  }
  if (!below && !above) return {unseen_, PeakPrediction::Basis::unseen};
  double kib;
  if (below && above && size_of(*above) > size_of(*below)) {
    double t = (x - size_of(*below)) / (size_of(*above) - size_of(*below));
    kib = static_cast<double>(below->peak_kib) +
          t * (static_cast<double>(above->peak_kib) - static_cast<double>(below->peak_kib));
    kib = std::max(kib, static_cast<double>(std::min(below->peak_kib, above->peak_kib)));
  } else if (below) {
    // Larger than every graph seen: along the line through the smallest and the largest
    // graph seen (a compiler's peak has a part that does not grow with the graph, which
    // a proportion would multiply too), never below the largest's peak. With one size
    // seen, in proportion, but never past the default for a graph never seen: one point
    // says no more than none.
    const PeakSample* smallest = below;
    for (const auto& s : samples)
      if (double sx = size_of(s); sx > 0 && sx < size_of(*smallest)) smallest = &s;
    const double top = static_cast<double>(below->peak_kib);
    if (smallest != below) {
      const double slope = (top - static_cast<double>(smallest->peak_kib)) / (size_of(*below) - size_of(*smallest));
      kib = top + std::max(0.0, slope) * (x - size_of(*below));
    } else {
      kib = std::max(top, std::min(top * (x / size_of(*below)), static_cast<double>(unseen_) / 1024.0));
    }
  } else {
    // Smaller than every graph seen: as the nearest. Never scaled down, since a
    // compiler's peak has a part that does not shrink with the graph.
    kib = static_cast<double>(above->peak_kib);
  }
  return {with_headroom(kib), PeakPrediction::Basis::neighbours};
}

NEFFCACHE_DECL std::string PeakHistory::file_of(const ContentId& id) const {
  return fmt::format("{}/{}/{}.jsonl", dir_, id.compiler_dir, id.flags_hash);
}

NEFFCACHE_DECL PeakHistory::Group& PeakHistory::load_locked(const ContentId& id) {
  Group& g = groups_[id.compiler_dir + "+" + id.flags_hash];
  if (dir_.empty()) return g;
  detail::UniqueFd fd(::open(file_of(id).c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC));
  struct stat st {};
  if (!fd || ::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= g.read_to) return g;
  std::string text(static_cast<std::size_t>(st.st_size - g.read_to), '\0');
  ssize_t n = ::pread(fd.get(), text.data(), text.size(), g.read_to);
  if (n <= 0) return g;
  text.resize(static_cast<std::size_t>(n));
  text.resize(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);  // whole lines only
  g.read_to += static_cast<off_t>(text.size());
  for (std::size_t at = 0; at < text.size();) {
    auto end = text.find('\n', at);
    auto j = nlohmann::json::parse(std::string_view(text).substr(at, end - at), nullptr, false);
    at = end + 1;
    if (!j.is_object()) continue;
    PeakSample s{j.value("sha256", ""), j.value("instructions", uint64_t{0}), j.value("hlo_bytes", uint64_t{0}),
                 j.value("peak_kib", uint64_t{0})};
    if (s.peak_kib > 0) g.samples.push_back(std::move(s));
  }
  ++version_;
  return g;
}

}  // namespace neffcache
