// NKI kernels an HLO calls by file. A graph that calls an NKI kernel names the kernel's
// compiled binary by absolute path in the custom call's backend_config: base64 of a JSON
// object whose klir_binary.binary is the path (under /var/tmp/nki-intermediate-cache by
// default). neuronx-cc reads that file; a host without it fails the compile
// (NCC_EVRF059), so a cache shared between hosts must carry it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

namespace neffcache::detail {

// Decodes standard base64 (with '=' padding); nullopt for anything else.
inline std::optional<std::string> base64_decode(std::string_view text) {
  if (text.empty() || text.size() % 4 != 0) return std::nullopt;
  std::string out(text.size() / 4 * 3, '\0');
  int n = ::EVP_DecodeBlock(reinterpret_cast<unsigned char*>(out.data()),
                            reinterpret_cast<const unsigned char*>(text.data()), static_cast<int>(text.size()));
  if (n < 0) return std::nullopt;
  // EVP_DecodeBlock counts the bytes that the padding stands for as zeros.
  std::size_t padding = text.ends_with("==") ? 2 : text.ends_with('=') ? 1 : 0;
  out.resize(static_cast<std::size_t>(n) - padding);
  return out;
}

// The kernel binary an instruction's backend_config names (klir_binary.binary of its
// JSON, base64-encoded or plain); nullopt when it names none.
inline std::optional<std::string> nki_kernel_path(std::string_view backend_config) {
  if (backend_config.empty()) return std::nullopt;
  std::optional<std::string> decoded;
  if (backend_config.front() != '{') {
    decoded = base64_decode(backend_config);
    if (!decoded || decoded->empty() || decoded->front() != '{') return std::nullopt;
  }
  auto j = nlohmann::json::parse(decoded ? std::string_view(*decoded) : backend_config, nullptr, false);
  if (!j.is_object()) return std::nullopt;
  auto k = j.find("klir_binary");
  if (k == j.end() || !k->is_object()) return std::nullopt;
  auto b = k->find("binary");
  if (b == k->end() || !b->is_string() || b->get_ref<const std::string&>().empty()) return std::nullopt;
  return b->get<std::string>();
}

}  // namespace neffcache::detail
