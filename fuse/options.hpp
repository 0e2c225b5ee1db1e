// The daemon's options (set from the command line in main.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <neffcache/s3_tier.hpp>
#include <neffcache/scheduler.hpp>

namespace neffcachefs {

struct Options {
  std::string backing;          // absolute path of the backing directory
  // A cache in S3: `backing` is its local tier, filled from S3 as names are asked for,
  // and compiles and fetches go through it (s3_tier.hpp).
  std::shared_ptr<neffcache::S3Tier> tier;
  std::string s3_url;
  neffcache::Scheduler::Options scheduler;
  bool eager = true;            // compile an HLO as soon as it is written through the mount
  bool retry_failed = false;    // failed entries compile again when opened
  std::vector<std::string> default_flags;
  // How long an open may wait for a compile before it fails with EIO (the compile goes
  // on). 0: no deadline of its own; each attempt is still bounded by the compile timeout.
  std::chrono::milliseconds wait_timeout{0};
};

}  // namespace neffcachefs
