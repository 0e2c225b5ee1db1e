// The daemon's metrics file (metrics_file.hpp).
#include "metrics_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include <neffcache/core/file.hpp>

namespace neffcachefs {

MetricsFile::MetricsFile(std::string path, std::chrono::milliseconds interval,
                         std::function<std::string()> text)
    : path_(std::move(path)), interval_(interval), text_(std::move(text)) {}

std::string MetricsFile::check(const std::string& path) {
  const std::filesystem::path p(path);
  if (p.filename().empty()) return fmt::format("{} names a folder, not a file", path);
  const std::string dir = p.parent_path().empty() ? "." : p.parent_path().string();
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    return fmt::format("cannot create files in {}: {}", dir, std::strerror(errno));
  std::error_code ec;
  if (std::filesystem::is_directory(p, ec)) return fmt::format("{} is a folder", path);
  return "";
}

void MetricsFile::start() {
  write();
  thread_ = std::thread([this] {
    std::unique_lock lk(mu_);
    while (!cv_.wait_for(lk, interval_, [this] { return stopping_; })) {
      lk.unlock();
      write();
      lk.lock();
    }
  });
}

void MetricsFile::stop() {
  {
    std::lock_guard lk(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
    write();
  }
}

void MetricsFile::write() {
  // (Its temporary file, beside it, does not end in .prom: the collector skips it.)
  auto written = neffcache::write_file_atomic(path_, text_());
  if (!written && !failing_)
    fmt::print(stderr, "neffcachefs: metrics file: {} (said once until a write succeeds)\n",
               written.error().message);
  else if (written && failing_)
    fmt::print(stderr, "neffcachefs: metrics file: {} written again\n", path_);
  failing_ = !written;
}

}  // namespace neffcachefs
