// Just-in-time clients for the compiler shim's tests: simulated training processes that
// name entries as the real client does (neuron-client-sim --key raw) and run `neuronx-cc`
// from PATH on a miss, with the shim's folder of links first in PATH or not.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch_test_macros.hpp>
#include <nlohmann/json.hpp>

#include <neffcache/compile/memory.hpp>

#include "hlo_variants.hpp"
#include "jit_env.hpp"
#include "paths.hpp"
#include "process.hpp"
#include "support.hpp"

namespace test {

inline const fs::path k_shim_dir = test::path::shim_dir;

// A folder holding the real compiler (the fake) under its real name, as an SDK has it.
inline fs::path real_compiler_dir(const TempDir& dir) {
  const fs::path real = dir / "sdk-bin";
  fs::create_directories(real);
  fs::create_symlink(k_fake, real / "neuronx-cc");
  return real;
}

// The graphs of a training job and of the job after it, as files in a folder: `a` and
// `b` (the first job's), their twins `a2` and `b2` (the same graphs with other debug
// metadata, so other names to the real client) and a new graph `c`.
struct JitGraphs {
  fs::path a, b, a2, b2, c;
};
inline JitGraphs jit_graphs(const TempDir& dir) {
  JitGraphs g{dir / "a.pb", dir / "b.pb", dir / "a-debug.pb", dir / "b-debug.pb", dir / "c.pb"};
  const std::string a = slurp(k_corpus / "spu_tf_jit_comp.hlo.pb"), b = slurp(k_corpus / "rocm08_normal_9.hlo_proto.pb");
  spit(g.a, a);
  spit(g.b, b);
  spit(g.a2, debug_variant(a));
  spit(g.b2, debug_variant(b));
  spit(g.c, slurp(k_corpus / "gopjrt_tuple.hlo.pb"));
  return g;
}

// PATH with `first` before the system's folders.
inline std::string path_with(std::initializer_list<fs::path> first) {
  std::string p;
  for (const auto& d : first) p += d.string() + ":";
  return p + "/usr/bin:/bin";
}

// A clean Neuron environment for a client of `cache` whose PATH is `path`; the fake
// compiler logs each real compile to `log`.
inline std::vector<std::string> jit_env(const fs::path& cache, const fs::path& log, const std::string& path) {
  return jit_env_words(cache, log, path, {"NEFFCACHE_FAKE_RATE=0"});
}

// One simulated rank with the environment `env`, started: it loads every graph of
// `graphs` just in time.
inline std::unique_ptr<Child> start_jit(const std::vector<std::string>& env, const std::vector<fs::path>& graphs) {
  auto argv = env;
  for (const auto& a : {k_sim, std::string("--json"), std::string("--key"), std::string("raw"),
                        std::string("--flag=-O1"), std::string("--poll"), std::string("0.02")})
    argv.push_back(a);
  for (const auto& g : graphs) argv.push_back(g.string());
  return std::make_unique<Child>(argv, /*quiet_stderr=*/true);
}

// The summary of a rank start_jit started, once it ends; it must succeed.
inline nlohmann::json summary_of(Child& rank) {
  std::string text = rank.rest();
  CHECK(rank.wait() == 0);
  auto begin = text.find("{\n");
  REQUIRE(begin != std::string::npos);
  return nlohmann::json::parse(text.substr(begin));
}

// One simulated rank per environment of `ranks`, all at once, each loading every graph of
// `graphs` just in time. Their summaries; each must succeed.
inline std::vector<nlohmann::json> train_jit(const std::vector<std::vector<std::string>>& ranks,
                                             const std::vector<fs::path>& graphs) {
  std::vector<std::unique_ptr<Child>> children;
  for (const auto& env : ranks) children.push_back(start_jit(env, graphs));
  std::vector<nlohmann::json> out;
  for (auto& c : children) out.push_back(summary_of(*c));
  return out;
}

// `n` ranks with the same environment.
inline std::vector<std::vector<std::string>> ranks_of(int n, const std::vector<std::string>& env) {
  return std::vector<std::vector<std::string>>(static_cast<std::size_t>(n), env);
}

// A summary field added over the ranks.
inline int sum_of(const std::vector<nlohmann::json>& summaries, const char* field) {
  int n = 0;
  for (const auto& s : summaries) n += s[field].get<int>();
  return n;
}

// Another process of the host that holds no memory and waits for some of the ledger's
// budget at `dir` (say, for the compiles of another user to end), refreshing its claim as a
// waiting process does: a compile of the shim that would not leave it that much waits.
class WaitingClaim {
 public:
  WaitingClaim(const std::string& dir, uint64_t budget, uint64_t bytes)
      : ledger_(neffcache::MemoryLedger::open(dir, budget, "other").value()) {
    set(bytes);
  }
  // Claims `bytes` from now on (0: none, and the shim may go).
  void set(uint64_t bytes) {
    bytes_ = bytes;
    ledger_->admit([&](neffcache::MemoryLedger::Admission& a) -> uint64_t { return a.waiting = bytes_, 0; });
  }
  // Keeps the claim for `d`.
  void hold(std::chrono::milliseconds d) {
    for (auto until = std::chrono::steady_clock::now() + d; std::chrono::steady_clock::now() < until;)
      std::this_thread::sleep_for(std::chrono::milliseconds(100)), set(bytes_);
  }
  // Keeps the claim until a neffcache-cc says in the ledger that it waits too (at most 30 s).
  bool hold_until_shim_waits() {
    for (int i = 0; i < 300; ++i) {
      hold(std::chrono::milliseconds(100));
      for (const auto& h : ledger_->holders())
        if (h.program == "neffcache-cc" && h.waiting > 0) return true;
    }
    return false;
  }

 private:
  std::shared_ptr<neffcache::MemoryLedger> ledger_;
  uint64_t bytes_ = 0;
};

}  // namespace test
