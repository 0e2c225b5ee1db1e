// Definitions of compile/batch.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/batch.hpp>

#include <algorithm>
#include <cmath>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace neffcache {

NEFFCACHE_DECL void Batch::submit(const std::string& entry_dir, Priority priority, bool again) {
  const auto version = compiler_version(settings_);
  if (auto serves = compiler_serves(entry_dir, version, settings_.compiler.program()); !serves) {
    std::string folder = compiler_dir_of(entry_dir);
    bool first;
    {
      std::lock_guard lk(mu_);
      first = skipped_.insert(folder).second;
    }
    if (first && settings_.log)
      settings_.log(fmt::format("{} (every entry of {} is skipped)", serves.error().message, folder));
    return;
  }
  {
    std::lock_guard lk(mu_);
    auto [it, added] = items_.try_emplace(entry_dir, Item{entry_dir, hlo_path_of(entry_dir), {}});
    if (added) {
      order_.push_back(entry_dir);
    } else {
      if (!again || !it->second.result) return;
      --finished_;
      --(is_success(it->second.result->outcome) ? done_ : failed_);
      it->second.result.reset();
    }
  }
  scheduler_.submit(prepare_job(entry_dir, default_flags_, version.value_or("")), priority,
                    [this, entry_dir](const CompileResult& r) {
                      std::lock_guard lk(mu_);
                      items_.at(entry_dir).result = r;
                      ++finished_;
                      (is_success(r.outcome) ? done_ : failed_) += 1;
                      cv_.notify_all();
                    });
}

NEFFCACHE_DECL Batch::Counts Batch::counts() const {
  auto p = scheduler_.progress();
  std::lock_guard lk(mu_);
  Counts c;
  c.total = order_.size();
  c.done = done_;
  c.failed = failed_;
  // The scheduler knows which unfinished entries wait on another process's lock.
  c.locked = std::min(p.locked, c.total - finished_);
  c.remaining = c.total - finished_ - c.locked;
  return c;
}

NEFFCACHE_DECL std::vector<Batch::Item> Batch::items() const {
  std::lock_guard lk(mu_);
  std::vector<Item> out;
  for (const auto& e : order_) out.push_back(items_.at(e));
  return out;
}

NEFFCACHE_DECL std::string Batch::hlo_path_of(const std::string& entry_dir) {
  // (An entry not in a folder here, an S3 one, is named by its dialect's usual input.)
  auto files = read_entry_files(entry_dir);
  std::string_view name = files && files->hlo_name()                       ? *files->hlo_name()
                          : EntryFiles::of_entry_path(entry_dir).is_lnl() ? k_lnl_hlo_file
                                                                           : k_hlo_module_file;
  return fmt::format("{}/{}", entry_dir, name);
}

NEFFCACHE_DECL nlohmann::ordered_json neuron_report(const std::vector<Batch::Item>& items,
                                                    std::chrono::system_clock::time_point start, double seconds) {
  nlohmann::ordered_json summary = nlohmann::ordered_json::object(), report = nlohmann::ordered_json::object();
  for (const auto& item : items) {
    if (!item.result) continue;
    bool ok = is_success(item.result->outcome);
    std::string status = ok ? "true" : "false";
    summary[status] = summary.value(status, 0) + 1;
    report[item.hlo_path] = {{"status", ok},
                             {"retry", std::max(0, item.result->attempts - 1)},
                             {"compile_time", std::round(item.result->compile_seconds * 100) / 100}};
  }
  return {{"compilation_summary", summary},
          {"compilation_report", report},
          {"start_time", std::chrono::duration<double>(start.time_since_epoch()).count()},
          {"compilation_time", seconds}};
}

}  // namespace neffcache
