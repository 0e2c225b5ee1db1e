// Graphs that call NKI kernels, for tests: a custom call whose backend_config names the
// kernel binary by path, as torch-neuronx writes such calls.
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

#include "hlo_variants.hpp"
#include "support.hpp"

namespace test {

inline std::string base64(std::string_view bytes) {
  std::string out(4 * ((bytes.size() + 2) / 3) + 1, '\0');
  int n = ::EVP_EncodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                            reinterpret_cast<const unsigned char*>(bytes.data()), static_cast<int>(bytes.size()));
  out.resize(static_cast<std::size_t>(n));
  return out;
}

// The corpus graph `corpus_file` whose first instruction calls the NKI kernel binary
// `kernel` (an absolute path).
inline std::string graph_calling(const std::string& kernel, const std::string& corpus_file = "gopjrt_tuple.hlo.pb") {
  auto g = Graph::load(slurp(k_corpus / corpus_file));
  auto* ins = g.module.mutable_computations(0)->mutable_instructions(0);
  ins->set_custom_call_target("AwsNeuronCustomNativeKernel");
  ins->set_backend_config(base64(nlohmann::json{{"klir_binary", {{"binary", kernel}}}, {"grid", {1}}}.dump()));
  return g.serialize();
}

}  // namespace test
