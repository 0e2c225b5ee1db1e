// Definitions of store/scheduling.hpp (core/decl.hpp).
#pragma once

#include <neffcache/store/scheduling.hpp>

#include <memory>

namespace neffcache::store {

NEFFCACHE_DECL void compile_through(const Store& store, Scheduler::Options& so) {
  if (auto compile = store.compile_function()) so.compile = std::move(compile);
  so.settled = store.settled_function();
  so.reuse = store.reuse_function();
  so.record = store.record_function();
  so.peaks = std::make_shared<PeakHistory>(store.peaks_dir());
}

}  // namespace neffcache::store
