// The log level of a tool's own lines (the Neuron tool's --log_level): lines below it are
// not printed. Errors ("<tool>: error: ...") are always printed.
#pragma once

#include <optional>
#include <string_view>

namespace neffcache::tools {

enum class LogLevel { debug, info, warning, error };

// DEBUG, INFO, WARNING or ERROR (as Python's logging names them); nullopt for anything else.
inline std::optional<LogLevel> parse_log_level(std::string_view s) {
  if (s == "DEBUG") return LogLevel::debug;
  if (s == "INFO") return LogLevel::info;
  if (s == "WARNING") return LogLevel::warning;
  if (s == "ERROR") return LogLevel::error;
  return std::nullopt;
}

// The process's level; INFO until a tool sets it (once, before it prints anything).
inline LogLevel& log_threshold() {
  static LogLevel level = LogLevel::info;
  return level;
}

// Whether a line of `level` is printed.
inline bool logs(LogLevel level) { return level >= log_threshold(); }

}  // namespace neffcache::tools
