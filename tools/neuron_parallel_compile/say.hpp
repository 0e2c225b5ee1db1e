// How neuron_parallel_compile speaks: its one-line errors, and its own log lines (as the
// Neuron tool tags them) at the level --log_level lets through.
#pragma once

#include <cstdio>
#include <string>

#include <fmt/format.h>

#include "common/log.hpp"
#include "neffcache/common.hpp"

namespace neffcache::npc {

inline constexpr const char* k_tag = "||NEURON_PARALLEL_COMPILE||:";

inline int fail(const std::string& msg) {
  fmt::print(stderr, "neuron_parallel_compile: error: {}\n", msg);
  return cli::k_exit_error;
}

inline void warn(const std::string& msg) {
  if (tools::logs(tools::LogLevel::warning)) fmt::print(stderr, "WARNING {} {}\n", k_tag, msg);
}

inline void info(const std::string& msg) {
  if (tools::logs(tools::LogLevel::info)) fmt::print(stderr, "INFO {} {}\n", k_tag, msg);
}

inline void debug(const std::string& msg) {
  if (tools::logs(tools::LogLevel::debug)) fmt::print(stderr, "DEBUG {} {}\n", k_tag, msg);
}

}  // namespace neffcache::npc
