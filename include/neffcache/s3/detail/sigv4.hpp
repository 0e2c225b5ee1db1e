// AWS Signature Version 4 for S3, as pure functions over a described request, so the
// signing is checked against AWS's published examples without a server.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <neffcache/core/decl.hpp>
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

NEFFCACHE_DECL std::string hmac_sha256(std::string_view key, std::string_view data);

// RFC 3986 percent-encoding: unreserved characters stay, everything else is %XX
// (upper-case hex). `keep_slash` for object keys in the path.
NEFFCACHE_DECL std::string uri_encode(std::string_view s, bool keep_slash);

using NameValues = std::vector<std::pair<std::string, std::string>>;

// The query string, sorted and encoded as SigV4 requires; the same text goes on the
// wire, so what is signed is what is sent.
NEFFCACHE_DECL std::string canonical_query(NameValues query);

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
NEFFCACHE_DECL std::string sigv4_authorization(SigningRequest req, const SigningKey& key);

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/s3/detail/sigv4.ipp>
#endif
