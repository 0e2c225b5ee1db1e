// What every neffcache subcommand shares: exit codes and the one-line error format.
#pragma once

#include <cstdio>
#include <string_view>

#include <fmt/format.h>

#include <neffcache/result.hpp>

namespace neffcache::cli {

// Exit codes scripts can rely on.
inline constexpr int k_exit_ok = 0;
inline constexpr int k_exit_error = 1;  // bad input or a failed operation; stderr says which
inline constexpr int k_exit_usage = 2;  // the command line itself is wrong

inline int report(const Error& e) {
  fmt::print(stderr, "neffcache: error: {}\n", e.message);
  return k_exit_error;
}

inline int report(std::string_view message) {
  fmt::print(stderr, "neffcache: error: {}\n", message);
  return k_exit_error;
}

}  // namespace neffcache::cli
