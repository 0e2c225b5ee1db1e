// Running a short helper command and capturing its output, with a deadline.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache::detail {

struct Captured {
  int exit_code = -1;  // -1 when killed by a signal
  std::string output;  // stdout and stderr, interleaved
};

// Runs argv[0] (searched on PATH) with stdout and stderr captured. A command still
// running at the deadline is killed and reported as Errc::io ETIMEDOUT; a command
// that cannot be started is Errc::not_found (ENOENT) or Errc::io.
NEFFCACHE_DECL Result<Captured> run_capture(const std::vector<std::string>& argv, std::chrono::milliseconds timeout);

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/core/detail/process.ipp>
#endif
