// Definitions of hlo/detail/nki.hpp (core/decl.hpp).
#pragma once

#include <neffcache/hlo/detail/nki.hpp>

#include <nlohmann/json.hpp>
#include <openssl/evp.h>

namespace neffcache::detail {

NEFFCACHE_DECL std::optional<std::string> base64_decode(std::string_view text) {
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

NEFFCACHE_DECL std::optional<std::string> nki_kernel_path(std::string_view backend_config) {
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
