// AWS Signature Version 4 for S3, as pure functions over a described request, so the
// signing is checked against AWS's published examples without a server.
#pragma once

#include <algorithm>
#include <array>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <neffcache/core/detail/digest.hpp>

namespace neffcache::detail {

inline constexpr std::string_view k_unsigned_payload = "UNSIGNED-PAYLOAD";
inline constexpr std::string_view k_empty_sha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

inline std::string sha256_hex(std::string_view bytes) {
  auto d = Digest::sha256();
  d.update(bytes);
  return d.hex();
}

inline std::string hmac_sha256(std::string_view key, std::string_view data) {
  std::array<unsigned char, EVP_MAX_MD_SIZE> out{};
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len))
    throw std::runtime_error("OpenSSL HMAC failure");
  return std::string(reinterpret_cast<const char*>(out.data()), len);
}

// RFC 3986 percent-encoding: unreserved characters stay, everything else is %XX
// (upper-case hex). `keep_slash` for object keys in the path.
inline std::string uri_encode(std::string_view s, bool keep_slash) {
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

using NameValues = std::vector<std::pair<std::string, std::string>>;

// The query string, sorted and encoded as SigV4 requires; the same text goes on the
// wire, so what is signed is what is sent.
inline std::string canonical_query(NameValues query) {
  for (auto& [k, v] : query) {
    k = uri_encode(k, false);
    v = uri_encode(v, false);
  }
  std::sort(query.begin(), query.end());
  std::string out;
  for (const auto& [k, v] : query) out += fmt::format("{}{}={}", out.empty() ? "" : "&", k, v);
  return out;
}

struct SigningRequest {
  std::string_view method;    // "GET"
  std::string_view path;      // already encoded: "/bucket/key" or "/key"
  std::string_view query;     // canonical_query()
  NameValues headers;         // every header to sign, host and x-amz-date included
  std::string_view payload_hash;  // hex SHA-256 of the body, or UNSIGNED-PAYLOAD
};

struct SigningKey {
  std::string_view access_key;
  std::string_view secret_key;
  std::string_view region;
  std::string_view amz_date;  // "20130524T000000Z"
};

// The Authorization header value for `req`.
inline std::string sigv4_authorization(SigningRequest req, const SigningKey& key) {
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

}  // namespace neffcache::detail
