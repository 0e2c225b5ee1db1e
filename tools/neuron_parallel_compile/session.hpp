// The graphs of a trial run and, for collect-and-compile off a mount, their compiles,
// started as the graphs are extracted. The cache is the one the trial run says it used
// (the cache-path log), opened as a store when the first graph appears.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <neffcache/compile/batch.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/store/store.hpp>

#include "neuron_parallel_compile/args.hpp"
#include "neuron_parallel_compile/trial.hpp"

namespace neffcache::npc {

class Session {
 public:
  Session(const Args& a, RunFiles files) : args_(a), files_(std::move(files)) {}

  // The cache, opened once: the one in the cache-path log, else the Neuron precedence of
  // our environment.
  Result<const store::Store*> cache();

  // Whether graphs compile here as they come (else the command or the daemon does).
  Result<bool> overlapped();

  // An "Extracting graphs (PATH)" line: a graph, or a warning when PATH is no entry of the cache.
  Result<void> add(const std::string& path);

  // The graphs, by their path in the cache, in the order extracted.
  std::vector<std::string> graphs() const;

  // After the trial run: the other nodes' graphs, and pending entries the run wrote
  // without announcing them, compile too; waits for every compile and reports. Returns
  // the exit status.
  Result<int> finish(std::chrono::steady_clock::time_point t0);

 private:
  Result<void> start_batch(const store::Store& c);

  const Args& args_;
  RunFiles files_;
  std::unique_ptr<store::Store> cache_;
  std::vector<store::Entry> graphs_;  // in the order extracted
  std::vector<store::Entry> later_;   // other nodes' graphs, compiled after the trial run
  std::unique_ptr<Batch> batch_;
  std::chrono::system_clock::time_point start_ = std::chrono::system_clock::now();
};

}  // namespace neffcache::npc
