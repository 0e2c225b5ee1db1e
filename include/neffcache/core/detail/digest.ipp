// Definitions of core/detail/digest.hpp (core/decl.hpp).
#pragma once

#include <neffcache/core/detail/digest.hpp>

#include <array>

namespace neffcache::detail {

NEFFCACHE_DECL std::string to_hex(const unsigned char* data, std::size_t size) {
  static constexpr char k_digits[] = "0123456789abcdef";
  std::string out(size * 2, '\0');
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = k_digits[data[i] >> 4];
    out[2 * i + 1] = k_digits[data[i] & 0xf];
  }
  return out;
}

NEFFCACHE_DECL std::string Digest::hex() {
  std::array<unsigned char, EVP_MAX_MD_SIZE> md{};
  unsigned int len = 0;
  if (EVP_DigestFinal_ex(ctx_.get(), md.data(), &len) != 1) fail();
  return to_hex(md.data(), len);
}

}  // namespace neffcache::detail
