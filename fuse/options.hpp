// The daemon's options (set from the command line in daemon.cpp).
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <neffcache/compile/scheduler.hpp>
#include <neffcache/store/store.hpp>

namespace neffcachefs {

struct Options {
  std::string backing;          // absolute path of the backing directory: layer 0, the one written
  std::string mountpoint;       // absolute: where the mount is (stats.json names it)
  // Read-only layers under the backing, searched after it in this order (layers.hpp):
  // BACKING itself under --upper, then every --lower; absolute paths.
  std::vector<std::string> lowers;
  // The backing is a private scratch folder over a read-only cache (no --upper): it takes
  // only lock files (layers.hpp); nothing else may be written, and nothing compiles.
  bool scratch = false;
  // The cache the mount serves, never null: the backing directory itself, or an S3 cache
  // whose local tier is `backing`, filled from S3 as names are asked for, with compiles
  // and fetches going through it (store/tier.hpp). The daemon asks it, never "is this S3?".
  std::shared_ptr<const neffcache::store::Store> store;
  neffcache::Scheduler::Options scheduler;
  bool eager = true;            // compile an HLO as soon as it is written through the mount
  bool retry_failed = false;    // failed entries compile again when opened
  // The compiler folder (neuronxcc-<v>) whose entries the compiler compiles (compiler_serves),
  // found at start; the others show no placeholders. Empty: none (LNL entries still compile).
  // nullopt: compiles are off, and every folder shows them (a miss is refused, a twin served).
  std::optional<std::string> compiler_dir;
  std::vector<std::string> default_flags;
  // How long an open may wait for a compile before it fails with EIO (the compile goes
  // on). 0: no deadline of its own; each attempt is still bounded by the compile timeout.
  std::chrono::milliseconds wait_timeout{0};
  // Readers of done files read through FUSE passthrough where the kernel and libfuse
  // allow it (passthrough.hpp); --no-passthrough turns it off.
  bool passthrough = true;
  // HLOs the start-up scan of the content index may read (entries it does not know yet).
  std::size_t index_scan = 10000;
};

}  // namespace neffcachefs
