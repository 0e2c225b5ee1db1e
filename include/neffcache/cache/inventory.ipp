// Definitions of cache/inventory.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/inventory.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

namespace neffcache {

NEFFCACHE_DECL std::size_t& StateCounts::of(EntryState s) {
  switch (s) {
    case EntryState::empty: return empty;
    case EntryState::pending: return pending;
    case EntryState::partial: return partial;
    case EntryState::compiling: return compiling;
    case EntryState::done: return done;
    case EntryState::failed: return failed;
    case EntryState::stale_lock: return stale;
  }
  return empty;
}

namespace detail {

NEFFCACHE_DECL void measure_entry(const EntryRef& ref, EntryInfo& info) {
  // A new open file: a dup would share the walk's directory position (at its end).
  int list_fd = ::openat(ref.dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (list_fd < 0) return;
  auto newest = std::chrono::system_clock::time_point{};
  const std::string neff_name = ref.files.neff_name();  // of the entry's dialect
  (void)list_dir(list_fd, info.path, [&](std::string_view name, bool) {
    struct stat st {};
    std::string n(name);
    if (::fstatat(ref.dir_fd, n.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) return;  // gone meanwhile
    if (S_ISREG(st.st_mode)) info.bytes += static_cast<uint64_t>(st.st_size);
    newest = std::max(newest, to_time_point(st.st_mtim));
    if (name == neff_name) {
      info.neff_bytes = static_cast<uint64_t>(st.st_size);
      info.last_use = std::max(to_time_point(st.st_atim), to_time_point(st.st_mtim));
    }
  });
  if (info.last_use == std::chrono::system_clock::time_point{}) info.last_use = newest;
  if (info.state != EntryState::done) return;
  const std::string dir = path_of_fd(ref.dir_fd);
  note_record(info, dir.empty() ? nlohmann::json::object() : read_entry_meta(dir));
}

NEFFCACHE_DECL void note_record(EntryInfo& info, const nlohmann::json& meta) {
  if (!meta.is_object() || meta.empty()) return;
  if (meta.contains("compile_seconds") && meta["compile_seconds"].is_number())
    info.compile_seconds = meta["compile_seconds"].get<double>();
  if (meta.contains("copied_from") && meta["copied_from"].is_string())
    info.copied_from = meta["copied_from"].get<std::string>();
  if (meta.contains("compile_seconds_saved") && meta["compile_seconds_saved"].is_number())
    info.saved_seconds = meta["compile_seconds_saved"].get<double>();
  if (!info.copied_from) {  // a twin's figures are its original's compile's
    info.peak_kib = meta.value("peak_rss_kib", uint64_t{0});
    info.predicted_peak_kib = meta.value("predicted_peak_kib", uint64_t{0});
    info.oom_retries = meta.value("oom_retries", 0);
  }
}

}  // namespace detail

NEFFCACHE_DECL Result<std::vector<EntryInfo>> list_entries(const Layers& layers, const LockOptions& lock) {
  std::vector<EntryInfo> out;
  auto r = for_each_entry(layers, [&](const LayerEntryRef& at) {
    EntryInfo info;
    info.path = at.ref.relative_path();
    info.layer = at.layer;
    info.files = at.ref.files;
    info.state = entry_state(at.ref, lock);
    detail::measure_entry(at.ref, info);
    out.push_back(std::move(info));
  });
  if (!r) return r.error();
  return out;
}

NEFFCACHE_DECL Result<StateCounts> count_entries(const Layers& layers, const LockOptions& lock) {
  StateCounts c;
  auto r = for_each_entry(layers, [&](const LayerEntryRef& at) { ++c.of(entry_state(at.ref, lock)); });
  if (!r) return r.error();
  return c;
}

NEFFCACHE_DECL std::vector<std::size_t> plan_gc(const std::vector<EntryInfo>& entries, uint64_t max_bytes,
                                                int keep_compilers) {
  std::vector<std::size_t> out;
  std::vector<bool> chosen(entries.size());
  uint64_t total = 0;
  for (const auto& e : entries) total += e.bytes;
  auto compiler_of = [](const EntryInfo& e) {
    return e.files.is_lnl() ? std::string() : e.path.substr(0, e.path.find('/'));
  };
  if (keep_compilers > 0) {
    std::map<std::string, std::chrono::system_clock::time_point> last_use;
    for (const auto& e : entries)
      if (!e.files.is_lnl()) last_use[compiler_of(e)] = std::max(last_use[compiler_of(e)], e.last_use);
    std::vector<std::pair<std::chrono::system_clock::time_point, std::string>> order;
    for (const auto& [c, t] : last_use) order.emplace_back(t, c);
    std::sort(order.rbegin(), order.rend());  // most recently used first
    std::set<std::string> dropped;
    for (std::size_t i = static_cast<std::size_t>(keep_compilers); i < order.size(); ++i)
      dropped.insert(order[i].second);
    for (std::size_t i = 0; i < entries.size(); ++i)
      if (dropped.count(compiler_of(entries[i]))) {
        out.push_back(i);
        chosen[i] = true;
        total -= entries[i].bytes;
      }
  }
  std::vector<std::size_t> done;
  for (std::size_t i = 0; i < entries.size(); ++i)
    if (!chosen[i] && entries[i].state == EntryState::done) done.push_back(i);
  std::sort(done.begin(), done.end(), [&](auto a, auto b) { return entries[a].last_use < entries[b].last_use; });
  for (auto i : done) {
    if (total <= max_bytes) break;
    out.push_back(i);
    total -= entries[i].bytes;
  }
  return out;
}

}  // namespace neffcache
