// Statistics of the daemon (stats.hpp).
#include "stats.hpp"

#include <algorithm>
#include <cstdio>

#include <fmt/format.h>

namespace neffcachefs {

void Stats::eio(EioSite site, const std::string& what) {
  ++eio_counts_[static_cast<int>(site)];
  fmt::print(stderr, "neffcachefs: EIO ({:02}) {}\n", static_cast<int>(site), what);
}

void Stats::opened_entry(const std::string& entry_dir) {
  std::lock_guard lk(opened_mu_);
  if (opened_.size() < k_max_opened) opened_.insert(entry_dir);
}

nlohmann::ordered_json Stats::document(const Context& ctx, bool with_opened) const {
  const auto& p = ctx.progress;
  nlohmann::ordered_json eio;
  for (int site = 1; site < static_cast<int>(EioSite::count); ++site)
    eio[fmt::format("{:02}", site)] = eio_counts_[site].load();
  nlohmann::ordered_json j{
      {"hits", hits.load()},
      {"misses", misses.load()},
      {"refused", refused.load()},
      {"waiters", waiters.load()},
      {"interrupted", interrupted.load()},
      {"read_bytes", read_bytes.load()},
      {"reads", reads.load()},
      {"passthrough", ctx.passthrough},
      {"compiles", {{"started", p.compiles_started}, {"succeeded", p.compiles_succeeded},
                    {"failed", p.compiles_failed}, {"transient", p.compiles_transient},
                    {"seconds", p.compile_seconds}}},
      // Entries given an equal graph's result instead of a compile, and the compile
      // time those results took.
      {"twins", {{"served", p.twins_served}, {"seconds_saved", p.twin_seconds_saved}}},
      {"index", ctx.index},
      {"memory", ctx.memory},
      {"entries", {{"queued", p.queued}, {"running", p.running}, {"locked", p.locked},
                   {"done", p.done}, {"failed", p.failed}}},
      {"eio", eio},
      {"jobs", ctx.jobs},
      // Where the mount is: the label of its metrics (--metrics-file, neffcache stats).
      {"mount", ctx.mountpoint},
      // Tools read the entries' true state there: through the mount, a lookup in a pending
      // entry finds the model.neff it will produce.
      {"backing", ctx.backing},
      // Over layers, entries are read in the first layer that has them (layers.hpp).
      {"layers", ctx.layers},
      {"read_only", ctx.read_only},
  };
  if (ctx.s3) j["s3"] = *ctx.s3;
  if (!with_opened) return j;
  // (Last: the list may be long.) Each entry by its path in the cache, whichever layer
  // holds it.
  auto& opened = j["opened"] = nlohmann::ordered_json::array();
  const auto roots = ctx.layer_roots();
  {
    std::lock_guard lk(opened_mu_);
    for (const auto& dir : opened_)
      for (const auto& root : roots)
        if (auto rel = neffcache::entry_path_in(root, dir)) {
          opened.push_back(*rel);
          break;
        }
  }
  return j;
}

uint64_t Stats::open_snapshot(std::string text) {
  std::lock_guard lk(snapshots_mu_);
  const uint64_t fh = ++next_snapshot_;
  snapshots_.emplace(fh, std::move(text));
  return fh;
}

std::string Stats::read_snapshot(uint64_t fh, std::size_t size, std::size_t off) {
  std::lock_guard lk(snapshots_mu_);
  const std::string& text = snapshots_.at(fh);
  return text.substr(std::min(text.size(), off), size);
}

void Stats::release_snapshot(uint64_t fh) {
  std::lock_guard lk(snapshots_mu_);
  snapshots_.erase(fh);
}

}  // namespace neffcachefs
