// Definitions of s3/tier_parts.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/tier_parts.hpp>

#include <sys/stat.h>

#include <algorithm>

#include <fmt/format.h>

namespace neffcache::detail {

NEFFCACHE_DECL bool RecentLooks::again(const std::string& what) {
  auto now = std::chrono::steady_clock::now();
  std::lock_guard lk(mu_);
  auto [it, fresh] = looked_.try_emplace(what, now);
  if (!fresh && now - it->second < k_recheck) return false;
  it->second = now;
  if (looked_.size() > 100000) std::erase_if(looked_, [&](const auto& kv) { return now - kv.second >= k_recheck; });
  return true;
}

NEFFCACHE_DECL bool RecentLooks::single_flight(const std::string& what, const std::function<bool()>& look) {
  std::promise<bool> mine;
  std::shared_future<bool> answer;
  {
    std::lock_guard lk(mu_);
    auto [it, first] = in_flight_.try_emplace(what);
    if (first) it->second = mine.get_future().share();
    else answer = it->second;
  }
  if (answer.valid()) return answer.get();
  bool found = look();
  mine.set_value(found);
  std::lock_guard lk(mu_);
  in_flight_.erase(what);
  return found;
}

NEFFCACHE_DECL void KeptNeffs::scan(const std::string& root) {
  const auto now_sys = std::chrono::system_clock::now();
  const auto now = std::chrono::steady_clock::now();
  std::map<std::string, Kept> found;
  (void)for_each_entry(root, [&](const EntryRef& e) {
    if (!e.files.done()) return;
    struct stat st {};
    if (::fstatat(e.dir_fd, e.files.neff_name().c_str(), &st, 0) != 0) return;
    const auto changed = std::chrono::system_clock::time_point(
        std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::seconds(st.st_mtim.tv_sec)));
    found[fmt::format("{}/{}", root, e.relative_path())] = {
        static_cast<uint64_t>(st.st_size),
        now - std::chrono::duration_cast<std::chrono::steady_clock::duration>(now_sys - changed)};
  });
  std::lock_guard lk(mu_);
  for (auto& [entry, k] : found) kept_[entry] = k;
}

NEFFCACHE_DECL std::vector<std::string> KeptNeffs::keep(const std::string& entry_dir, uint64_t bytes) {
  std::lock_guard lk(mu_);
  kept_[entry_dir] = {bytes, std::chrono::steady_clock::now()};
  uint64_t total = 0;
  for (const auto& [entry, k] : kept_) total += k.bytes;
  if (total <= cap_bytes_) return {};
  std::vector<std::pair<std::chrono::steady_clock::time_point, std::string>> by_age;
  for (const auto& [entry, k] : kept_) by_age.emplace_back(k.last_use, entry);
  std::sort(by_age.begin(), by_age.end());
  auto recent = std::chrono::steady_clock::now() - keep_after_use_;
  std::vector<std::string> out;
  for (const auto& [used, entry] : by_age) {
    if (total <= cap_bytes_ || used > recent) break;
    total -= kept_[entry].bytes;
    out.push_back(entry);
    kept_.erase(entry);
  }
  return out;
}

NEFFCACHE_DECL uint64_t KeptNeffs::bytes() const {
  std::lock_guard lk(mu_);
  uint64_t total = 0;
  for (const auto& [entry, k] : kept_) total += k.bytes;
  return total;
}

NEFFCACHE_DECL std::optional<StandIns::Held> StandIns::take(const std::string& entry_dir) {
  std::lock_guard lk(mu_);
  auto it = held_.find(entry_dir);
  if (it == held_.end()) return std::nullopt;
  std::optional<Held> held(std::move(it->second));
  held_.erase(it);
  return held;
}

NEFFCACHE_DECL void StandIns::put(const std::string& entry_dir, Held held) {
  std::optional<Held> dropped;
  {
    std::lock_guard lk(mu_);
    auto it = held_.find(entry_dir);
    if (it == held_.end()) {
      held_.emplace(entry_dir, std::move(held));
    } else if (it->second.hold->lost()) {
      dropped.emplace(std::move(it->second));
      it->second = std::move(held);
    } else {
      dropped.emplace(std::move(held));
    }
  }
  // (Given back without the mutex: a release is a request to S3.)
  if (dropped)
    if (auto lease = dropped->end()) (void)lease->release();
}

NEFFCACHE_DECL std::optional<bool> StandIns::live(const std::string& entry_dir) {
  std::optional<Held> lost;
  std::lock_guard lk(mu_);
  auto it = held_.find(entry_dir);
  if (it == held_.end()) return std::nullopt;
  if (!it->second.hold->lost()) return true;
  lost.emplace(std::move(it->second));  // (ended after the mutex: its KeepAlive thread is joined)
  held_.erase(it);
  return false;
}

NEFFCACHE_DECL std::optional<CompileSlots::Slot> CompileSlots::take(const std::function<bool()>& cancelled) {
  std::unique_lock lk(mu_);
  while (free_ == 0) {
    lk.unlock();
    if (cancelled && cancelled()) return std::nullopt;
    lk.lock();
    if (free_ == 0) cv_.wait_for(lk, std::chrono::milliseconds(100));
  }
  --free_;
  return Slot(*this);
}

NEFFCACHE_DECL void CompileSlots::give() {
  {
    std::lock_guard lk(mu_);
    ++free_;
  }
  cv_.notify_one();
}

}  // namespace neffcache::detail
