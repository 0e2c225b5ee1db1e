// neuron-client-sim [options] HLO_OR_DIR...: behaves toward a Neuron compile cache as a
// torch-xla training process with libneuronxla does, for tests and demos on machines
// where the real client cannot run.
//
// With NEURON_EXTRACT_GRAPHS_ONLY=1 (a neuron_parallel_compile trial run) it writes each
// graph's entry (compile_flags.json, model.hlo_module.pb) and prints the "Extracting
// graphs (...)" line, a little time apart. Otherwise it runs training steps; the first
// use of each graph looks in the cache, under the cache-wide lock <root>/lock (opened
// for writing and flocked, hits included, as libneuronxla does):
//   - model.neff and model.done there: read the NEFF ("Using a cached neff at ...");
//   - model.log and no NEFF: a cached failure, reported, not retried;
//   - else take the existence lock <hlo>.lock (O_EXCL), write the HLO, run the compiler
//     in a private work folder, copy the NEFF in, write model.done, remove the lock. A
//     lock that exists already means another process compiles: poll until it is gone.
// A killed simulator leaves its lock behind, as the real client does. With
// NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG set (by neuron_parallel_compile), it writes the
// cache it resolved into that file first, as the Neuron wrapper does.
//
// With --dialect lnl it behaves as vLLM Neuron and TorchNeuron (libtorch_neuronx_lite)
// do toward their cache, <$VLLM_CACHE_ROOT or $NEURON_LIBTORCH_CACHE_ROOT>/neuron/
// compile_cache/<key>/ (see load_lnl, in lnl.cpp).
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <neffcache/core/file.hpp>
#include <neffcache/compile/compile.hpp>
#include <neffcache/cache/key.hpp>
#include <neffcache/core/detail/digest.hpp>
#include <neffcache/core/detail/xxh3.hpp>

#include "client_sim/sim.hpp"
#include "common/version.hpp"

#include "neffcache/common.hpp"

namespace {

using namespace neffcache;
using namespace neffcache::clientsim;

// The HLO files named: files, and the *.pb files of folders, in name order.
Result<std::vector<std::string>> hlo_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    std::error_code ec;
    if (fs::is_directory(in, ec)) {
      std::vector<std::string> found;
      for (const auto& e : fs::directory_iterator(in, ec))
        if (e.is_regular_file() && e.path().extension() == ".pb") found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else if (fs::is_regular_file(in, ec)) {
      files.push_back(in);
    } else {
      return Error{Errc::not_found, fmt::format("{}: no such HLO file or folder", in)};
    }
  }
  if (files.empty()) return Error{Errc::not_found, "no HLO files (*.pb) in the folders given"};
  return files;
}

int fail(const std::string& message) {
  fmt::print(stderr, "neuron-client-sim: error: {}\n", message);
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  Options opts;
  CLI::App app{"neuron-client-sim: a stand-in for a torch-xla training process using the Neuron compile cache "
               "(graph extraction with NEURON_EXTRACT_GRAPHS_ONLY=1, else training steps that load or compile "
               "each graph)"};
  app.add_option("HLO", opts.inputs, "HLO files, or folders of them (*.pb)")->required();
  app.add_option("--flag", opts.flags, "a compiler flag (repeat; default: the compiler flags in NEURON_CC_FLAGS)")
      ->allow_extra_args(false);
  app.add_option("--compiler-version", opts.compiler_version, "default: asks '<compiler> --version'");
  app.add_option("--compiler", opts.compiler, "compiler command template for compiles on a miss")->capture_default_str();
  app.add_option("--steps", opts.steps, "training steps; graphs are loaded at their first use")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--step-seconds", opts.step_seconds, "device time of one step")->check(CLI::NonNegativeNumber);
  app.add_option("--extract-interval", opts.extract_interval, "seconds between two extracted graphs")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--poll", opts.poll_seconds, "seconds between two looks at a lock held by another process")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--max-wait", opts.max_wait, "give a graph up after waiting this long for another process's "
                                              "lock (default: wait forever, as torch-xla does)")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--json", opts.json, "print the summary as JSON on stdout");
  app.add_option("--dialect", opts.dialect, "the client: neuron (torch-xla, libneuronxla) or lnl (vLLM Neuron, "
                                            "TorchNeuron: libtorch_neuronx_lite)")
      ->check(CLI::IsMember({"neuron", "lnl"}))
      ->capture_default_str();
  app.add_option("--target", opts.target, "lnl: the platform target its compiles name")->capture_default_str();
  app.add_option("--key", opts.key,
                 "how entries are named: canonical (our key: graphs that differ only in debug information share "
                 "one) or raw (as the real clients name them: a hash of the HLO's bytes as written, debug "
                 "information included, and of the flags)")
      ->check(CLI::IsMember({"canonical", "raw"}))
      ->capture_default_str();
  app.add_flag("--save-cache", opts.save_cache,
               "lnl: after a compile, save_cache() it to NEURON_LIBTORCH_REMOTE_CACHE (a staging copy there, renamed "
               "to the key; a key taken already is left alone)");
  app.set_version_flag("--version", std::string("neuron-client-sim (neffcache) ") + neffcache::program_version(),
                       "print the version and exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }

  // An s3:// cache is for graph extraction only: the simulator stores graphs there as
  // the Neuron wrapper does; training reads an S3 cache through a neffcachefs mount.
  // Training reads the files of a local folder, as torch-xla does.
  const bool lnl = opts.dialect == "lnl";
  auto cache = cli::open_cache(lnl ? lnl_cache_root() : "");
  if (!cache) return fail(cache.error().message);
  const std::optional<std::string> folder = (*cache)->folder();
  const std::string extract_env = process_env("NEURON_EXTRACT_GRAPHS_ONLY").value_or("");
  const bool extract = !extract_env.empty() && extract_env != "0";
  if (lnl && extract) return fail("--dialect lnl: graph extraction is torch-xla's (NEURON_EXTRACT_GRAPHS_ONLY)");
  if (!folder && !extract)
    return fail(fmt::format("{}: only graph extraction is simulated on an s3:// cache (mount it with neffcachefs "
                            "to train)", (*cache)->name()));
  const std::string root = (*cache)->name();
  // Under neuron_parallel_compile, say which cache this process uses, as the Neuron
  // wrapper does: the tool compiles into that one.
  if (auto log = process_env("NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG"); log && !log->empty())
    if (auto w = detail::write_file_atomic(*log, root + "\n"); !w)
      return fail(fmt::format("NEURON_PARALLEL_COMPILE_CACHE_PATH_LOG: {}", w.error().message));
  auto flags = cli::compiler_flags(opts.flags);
  if (!flags) return fail(flags.error().message);
  auto tmpl = CompilerTemplate::parse(opts.compiler);
  if (!tmpl) return fail(tmpl.error().message);
  auto version = cli::compiler_version(opts.compiler_version, tmpl->program());
  if (!version) return fail(version.error().message);
  auto files = hlo_files(opts.inputs);
  if (!files) return fail(files.error().message);

  std::vector<Graph> graphs;
  std::vector<EntryKey> keys;
  for (const auto& f : *files) {
    auto bytes = read_file(f);
    if (!bytes) return fail(bytes.error().message);
    auto hlo = analyze_hlo(*bytes);
    if (!hlo) return fail(fmt::format("{}: {}", f, hlo.error().message));
    auto key = entry_key(*bytes, flags->compiler_flags, *version);
    if (!key) return fail(fmt::format("{}: {}", f, key.error().message));
    // --key raw: the graph is named as the real clients name it, by its bytes as
    // written, debug information included (torch-xla: a decimal 64-bit number).
    const std::string raw_hash = fmt::format("{}", detail::xxh3_64(*bytes + "\n" + python_json_list(flags->compiler_flags)));
    if (opts.key == "raw") key->graph_hash = raw_hash;
    // LNL's key, 32 hex digits: every rank of a job computes the same from the same
    // graph, compiler arguments, compiler and target.
    std::string path = lnl ? detail::md5_hex(fmt::format("{}|{}|{}|{}", opts.key == "raw" ? raw_hash : hlo->canonical_sha256,
                                                         python_json_list(flags->compiler_flags), *version, opts.target))
                           : key->relative_path();
    auto entry = (*cache)->at(path);
    if (!entry) return fail(entry.error().message);
    graphs.push_back({f, std::move(*bytes), hlo->canonical_sha256, entry->view()});
    keys.push_back(*key);
  }

  std::vector<GraphResult> results(graphs.size());
  std::vector<std::string> saved(graphs.size());  // LNL with --save-cache: see load_lnl
  nlohmann::ordered_json steps = nlohmann::ordered_json::array();
  const auto start = SteadyClock::now();
  if (extract) {
    for (std::size_t i = 0; i < graphs.size(); ++i) {
      if (i > 0) sleep_for(opts.extract_interval);
      auto entry = (*cache)->at(keys[i].relative_path());
      Result<bool> stored = entry ? (*cache)->put_graph(*entry, graphs[i].bytes, flags->compiler_flags)
                                  : Result<bool>(entry.error());
      if (!stored) {
        results[i] = {Outcome::failed, 0, 0, stored.error().message};
        continue;
      }
      results[i].outcome = Outcome::extracted;
      fmt::print(stderr, "{} Extracting graphs ({}/{}) for ahead-of-time parallel compilation. No compilation was done.\n",
                 k_wrapper_tag, graphs[i].entry, k_hlo_module_file);
    }
  } else {
    for (int step = 1; step <= opts.steps; ++step) {
      const auto t0 = SteadyClock::now();
      double on_cache = 0;
      for (std::size_t i = 0; i < graphs.size() && step == 1; ++i) {
        results[i] = lnl ? load_lnl(graphs[i], opts, *tmpl, flags->compiler_flags, *folder,
                                    fs::path(graphs[i].entry).filename().string(), saved[i])
                         : load(graphs[i], opts, *tmpl, flags->compiler_flags, *folder, keys[i]);
        on_cache += results[i].seconds;
        if (results[i].outcome != Outcome::failed) continue;
        fmt::print(stderr, "neuron-client-sim: error: {}: {}\n", graphs[i].input, results[i].error);
        if (!lnl) continue;
        // LNL ends the process at its first error; the graphs after it are never loaded.
        fmt::print(stderr, "FATAL: {}\n", results[i].error);
        for (std::size_t j = i + 1; j < graphs.size(); ++j) results[j] = {Outcome::failed, 0, 0, "not reached"};
        break;
      }
      sleep_for(opts.step_seconds);
      steps.push_back(nlohmann::ordered_json{{"step", step}, {"seconds", since(t0)}, {"cache_seconds", on_cache}});
      fmt::print(stderr, "step {}: {:.3f} s, {:.3f} s of it waiting on the cache\n", step, since(t0), on_cache);
    }
  }

  std::map<std::string, int> counts;
  double cache_seconds = 0, worst = 0;
  nlohmann::ordered_json per_graph = nlohmann::ordered_json::array();
  for (std::size_t i = 0; i < graphs.size(); ++i) {
    const auto& r = results[i];
    ++counts[to_string(r.outcome)];
    cache_seconds += r.seconds;
    worst = std::max(worst, r.seconds);
    nlohmann::ordered_json j{{"hlo", graphs[i].input}, {"entry", graphs[i].entry}, {"outcome", to_string(r.outcome)},
                             {"seconds", r.seconds}, {"neff_bytes", r.neff_bytes}};
    if (!r.error.empty()) j["error"] = r.error;
    if (!saved[i].empty()) ++counts[saved[i]], j["saved"] = saved[i];
    per_graph.push_back(std::move(j));
  }
  const int failed = counts["failed"];
  if (opts.json) {
    nlohmann::ordered_json summary{{"mode", std::string(extract ? "extract" : "train")},
                                   {"cache", root},
                                   {"graphs", graphs.size()},
                                   {"extracted", counts["extracted"]},
                                   {"hits", counts["hit"]},
                                   {"waited", counts["waited"]},
                                   {"fetched", counts["fetched"]},
                                   {"compiled", counts["compiled"]},
                                   {"promoted", counts["promoted"]},
                                   {"promotion_refused", counts["taken"]},
                                   {"failed", failed},
                                   {"cache_seconds", cache_seconds},
                                   {"worst_graph_seconds", worst},
                                   {"seconds", since(start)},
                                   {"steps", std::move(steps)},
                                   {"per_graph", std::move(per_graph)}};
    fmt::print("{}\n", summary.dump(2));
  } else if (extract) {
    fmt::print("{} graphs extracted, {} failed, in {:.2f} s\n", counts["extracted"], failed, since(start));
  } else {
    fmt::print("{} graphs: {} cache hits, {} compiled here, {} after waiting for another process's lock, {} fetched "
               "from the remote cache, {} failed; {:.2f} s waiting on the cache (worst graph {:.2f} s)\n",
               graphs.size(), counts["hit"], counts["compiled"], counts["waited"], counts["fetched"], failed,
               cache_seconds, worst);
  }
  return failed > 0 ? 1 : 0;
}
