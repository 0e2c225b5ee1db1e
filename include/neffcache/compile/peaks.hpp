// Peak memory of earlier compiles, and the prediction of a compile's peak made from them.
//
// A compile's peak (the whole process tree's, compile/runner.hpp) depends on its graph,
// its compiler and its flags. The history keeps one sample per compile, filed by compiler
// and flags hash: `<dir>/<neuronxcc-…>/<flags hash>.jsonl`, a line per sample appended
// whole (one write under O_APPEND), so several processes add to it without a lock. A
// cache keeps its history in `<root>/.neffcache/memory/`; a history opened on "" lives in
// this process only.
//
// The prediction for a graph (PeakHistory::predict):
//   - the same graph seen before: the largest peak it had;
//   - else, graphs of the same compiler and flags: by instruction count (the HLO's size
//     when counts are unknown), interpolated between the nearest smaller and larger
//     graph; a graph larger than any seen along the line through the smallest and the
//     largest seen (in proportion when only one size is known, up to `unseen`), one
//     smaller than any seen as the smallest (a compiler's peak has a part that does not
//     shrink with the graph, nor grow);
//   - else the default for a graph never seen (`unseen`, by default 64 GiB: the Neuron
//     tool's figure, so unseen graphs never run more at once than its pool would);
// then with k_peak_headroom on top.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/index.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>

namespace neffcache {

inline constexpr std::string_view k_peaks_dir = ".neffcache/memory";  // in a cache's root
inline constexpr uint64_t k_default_unseen_peak = 64ull << 30;
inline constexpr double k_peak_headroom = 1.2;

struct PeakSample {
  std::string graph_sha256;
  uint64_t instructions = 0;
  uint64_t hlo_bytes = 0;
  uint64_t peak_kib = 0;
};

struct PeakPrediction {
  uint64_t bytes = 0;  // headroom included
  enum class Basis { same_graph, neighbours, unseen } basis = Basis::unseen;
};

NEFFCACHE_DECL const char* to_string(PeakPrediction::Basis b);

// Thread-safe.
class PeakHistory {
 public:
  explicit PeakHistory(std::string dir = {}, uint64_t unseen = k_default_unseen_peak)
      : dir_(std::move(dir)), unseen_(unseen) {}

  const std::string& dir() const { return dir_; }
  uint64_t unseen() const { return unseen_; }

  // Bumped whenever what predict answers may have changed (a sample added here).
  uint64_t version() const {
    std::lock_guard lk(mu_);
    return version_;
  }

  // Adds a compile's peak under its content identity (a ContentId string; other keys
  // have no compiler and flags to file it under, and are not kept).
  void add(const std::string& key, uint64_t instructions, uint64_t hlo_bytes, uint64_t peak_kib);

  PeakPrediction predict(const std::string& key, uint64_t instructions, uint64_t hlo_bytes);

 private:
  struct Group {
    std::vector<PeakSample> samples;
    off_t read_to = 0;  // of the group's file: what is loaded already
  };

  std::string file_of(const ContentId& id) const;

  // The group of `id`'s compiler and flags, with what other processes appended since the
  // last look.
  Group& load_locked(const ContentId& id);

  const std::string dir_;
  const uint64_t unseen_;
  mutable std::mutex mu_;
  uint64_t version_ = 0;
  std::map<std::string, Group> groups_;
};

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/peaks.ipp>
#endif
