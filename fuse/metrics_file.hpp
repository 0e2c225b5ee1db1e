// The daemon's metrics in a file (--metrics-file), in Prometheus' text format, for
// node_exporter's textfile collector: written when the mount is up, every interval, and a
// last time when the daemon stops. Each write replaces the file whole (write_file_atomic): a
// reader sees one text or the one before, never a part.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace neffcachefs {

class MetricsFile {
 public:
  // `text` makes the file's content; it is called from this class's thread.
  MetricsFile(std::string path, std::chrono::milliseconds interval,
              std::function<std::string()> text);
  ~MetricsFile() { stop(); }
  MetricsFile(const MetricsFile&) = delete;
  MetricsFile& operator=(const MetricsFile&) = delete;

  // Whether `path` can be written (its folder exists and takes new files): "" or why not.
  static std::string check(const std::string& path);

  // Writes once, then starts the thread that writes every interval.
  void start();
  // Ends the thread and writes a last time. Idempotent.
  void stop();

 private:
  void write();

  const std::string path_;
  const std::chrono::milliseconds interval_;
  const std::function<std::string()> text_;
  // Rank 70 (docs/ARCHITECTURE.md): guards stopping_. A leaf.
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  bool failing_ = false;  // the last write failed: said once in the log until one succeeds
  std::thread thread_;
};

}  // namespace neffcachefs
