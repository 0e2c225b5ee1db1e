// LNL (vLLM Neuron, TorchNeuron) cache entries for tests, written as LNL writes them.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include <neffcache/cache/layout.hpp>
#include <neffcache/core/detail/digest.hpp>

#include "support.hpp"

namespace test {

// The key's lock file in an LNL root, as the facts name it (written out here, not taken
// from the library, so that a test catches a library that locks elsewhere).
inline fs::path lnl_lock(const fs::path& root, const std::string& key) {
  return root / ("." + key + ".compilation_metadata.lock");
}
// The holder file beside it.
inline fs::path lnl_holder(const fs::path& root, const std::string& key) {
  return root / ("." + key + ".compilation_metadata");
}

// A key as LNL makes them (32 hex digits), from any text.
inline std::string lnl_key(std::string_view seed) { return neffcache::detail::md5_hex(seed); }

// The command.txt LNL writes for `key` in the cache folder `original_dir` (the paths of
// the host that wrote it, which a compile elsewhere must not use).
inline std::string lnl_command_text(const std::string& key, const std::vector<std::string>& args,
                                    const std::string& target = "trn1",
                                    const std::string& original_dir = "/home/ubuntu/.cache/vllm/neuron/compile_cache") {
  std::string line = fmt::format("neuronx-cc compile {0}/{1}/graph.hlo --framework XLA --target {2} --output "
                                 "{0}/{1}/graph_{1}.neff --logfile {0}/{1}/log-neuron-cc.txt",
                                 original_dir, key, target);
  for (const auto& a : args) line += " " + a;
  return line + "\n";
}

// A pending LNL entry `<root>/<key>` holding the corpus file as graph.hlo, its
// command.txt (unless `with_command` is false) and LNL's metadata. Returns the folder.
inline fs::path make_lnl_entry(const fs::path& root, const std::string& corpus_file, const std::string& key,
                               const std::vector<std::string>& args = {"--model-type=transformer", "-O1"},
                               bool with_command = true) {
  auto dir = root / key;
  fs::create_directories(dir);
  fs::copy_file(k_corpus / corpus_file, dir / "graph.hlo", fs::copy_options::overwrite_existing);
  if (with_command) spit(dir / "command.txt", lnl_command_text(key, args));
  spit(dir / ".artifact_metadata_v0.json", fmt::format(R"({{"cache_key": "{}", "version": 0, "num_outputs": 1}})", key) + "\n");
  return dir;
}

}  // namespace test
