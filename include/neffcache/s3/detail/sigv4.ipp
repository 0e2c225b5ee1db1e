// Definitions of s3/detail/sigv4.hpp (core/decl.hpp).
#pragma once

#include <neffcache/s3/detail/sigv4.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <stdexcept>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

namespace neffcache {
namespace detail {

NEFFCACHE_DECL std::string hmac_sha256(std::string_view key, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len))
    throw std::runtime_error("OpenSSL HMAC failure");
  return std::string(reinterpret_cast<const char*>(out.data()), len);
}

NEFFCACHE_DECL std::string uri_encode(std::string_view s, bool keep_slash) {
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    bool unreserved = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                      c == '-' || c == '_' || c == '.' || c == '~';
    if (unreserved || (keep_slash && c == '/')) out += static_cast<char>(c);
    else out += fmt::format("%{:02X}", c);
  }
  return out;
}

NEFFCACHE_DECL std::string canonical_query(NameValues query) {
  for (auto& [k, v] : query) {
    k = uri_encode(k, false);
    v = uri_encode(v, false);
  }
  std::sort(query.begin(), query.end());
  std::string out;
  for (const auto& [k, v] : query) out += fmt::format("{}{}={}", out.empty() ? "" : "&", k, v);
  return out;
}

NEFFCACHE_DECL std::string sigv4_authorization(SigningRequest req, const SigningKey& key) {
  for (auto& [name, value] : req.headers) {
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    auto first = value.find_first_not_of(" \t");
    auto last = value.find_last_not_of(" \t");
    value = first == std::string::npos ? "" : value.substr(first, last - first + 1);
  }
  std::sort(req.headers.begin(), req.headers.end());
  std::string canonical_headers, signed_headers;
  for (const auto& [name, value] : req.headers) {
    canonical_headers += fmt::format("{}:{}\n", name, value);
    signed_headers += fmt::format("{}{}", signed_headers.empty() ? "" : ";", name);
  }
  std::string canonical = fmt::format("{}\n{}\n{}\n{}\n{}\n{}", req.method, req.path, req.query,
                                      canonical_headers, signed_headers, req.payload_hash);
  std::string_view day = key.amz_date.substr(0, 8);
  std::string scope = fmt::format("{}/{}/s3/aws4_request", day, key.region);
  std::string to_sign = fmt::format("AWS4-HMAC-SHA256\n{}\n{}\n{}", key.amz_date, scope, sha256_hex(canonical));
  std::string k = hmac_sha256(fmt::format("AWS4{}", key.secret_key), day);
  k = hmac_sha256(k, key.region);
  k = hmac_sha256(k, "s3");
  k = hmac_sha256(k, "aws4_request");
  std::string sig = hmac_sha256(k, to_sign);
  return fmt::format("AWS4-HMAC-SHA256 Credential={}/{},SignedHeaders={},Signature={}", key.access_key, scope,
                     signed_headers, to_hex(reinterpret_cast<const unsigned char*>(sig.data()), sig.size()));
}

}  // namespace detail
}  // namespace neffcache
