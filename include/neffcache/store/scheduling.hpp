// How a scheduler compiles a store's jobs (named by Store::view), wired in one place for
// the daemon, `neffcache compile` and neuron_parallel_compile.
#pragma once

#include <neffcache/compile/scheduler.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/store/store.hpp>

namespace neffcache::store {

// Gives `so` the store's compile function (the local tier's or S3's; a directory has none,
// and the scheduler compiles its folders with compile_entry), its "already settled?"
// check, the content index's reuse and record, and the history of peaks its compiles are
// predicted from (Store::peaks_dir). Whatever else `so` holds stays.
NEFFCACHE_DECL void compile_through(const Store& store, Scheduler::Options& so);

}  // namespace neffcache::store

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/store/scheduling.ipp>
#endif
