// Incremental MD5 and SHA-256 over OpenSSL's EVP interface, and hex output.
#pragma once

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include <openssl/evp.h>

#include <neffcache/core/decl.hpp>

namespace neffcache::detail {

NEFFCACHE_DECL std::string to_hex(const unsigned char* data, std::size_t size);

// One running digest. EVP failures mean a broken OpenSSL installation (not bad
// input), so they throw rather than travel through every Result.
class Digest {
 public:
  static Digest md5() { return Digest(EVP_md5()); }
  static Digest sha256() { return Digest(EVP_sha256()); }

  void update(std::string_view bytes) {
    if (EVP_DigestUpdate(ctx_.get(), bytes.data(), bytes.size()) != 1) fail();
  }

  // Finishes the digest; the object must not be updated afterwards.
  std::string hex();

 private:
  explicit Digest(const EVP_MD* type) : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), type, nullptr) != 1) fail();
  }
  [[noreturn]] static void fail() { throw std::runtime_error("OpenSSL digest failure"); }

  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

inline std::string md5_hex(std::string_view bytes) {
  auto d = Digest::md5();
  d.update(bytes);
  return d.hex();
}

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/core/detail/digest.ipp>
#endif
