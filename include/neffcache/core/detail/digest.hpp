// Incremental MD5 and SHA-256 over OpenSSL's EVP interface, and hex output.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <string_view>

#include <openssl/evp.h>

namespace neffcache::detail {

inline std::string to_hex(const unsigned char* data, std::size_t size) {
  static constexpr char k_digits[] = "0123456789abcdef";
  std::string out(size * 2, '\0');
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = k_digits[data[i] >> 4];
    out[2 * i + 1] = k_digits[data[i] & 0xf];
  }
  return out;
}

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
  std::string hex() {
    std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md.data(), &len) != 1) fail();
    return to_hex(md.data(), len);
  }

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
