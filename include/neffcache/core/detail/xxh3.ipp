// Definitions of core/detail/xxh3.hpp (core/decl.hpp).
#pragma once

#include <neffcache/core/detail/xxh3.hpp>

#include <vector>

#include <fmt/format.h>

namespace neffcache::detail {

NEFFCACHE_DECL std::string xxh3_hex(uint64_t h) { return fmt::format("{:016x}", h); }

NEFFCACHE_DECL Result<uint64_t> fd_xxh3(int fd, const std::string& what,
                                        const std::function<Result<void>(std::string_view chunk)>& each) {
  Xxh3 hash;
  std::vector<char> buf(1 << 20);
  for (off_t at = 0;;) {
    ssize_t n = sys::pread(fd, buf.data(), buf.size(), at);
    if (n < 0) return sys_error("read", what);
    if (n == 0) break;
    const std::string_view chunk(buf.data(), static_cast<std::size_t>(n));
    hash.update(chunk.data(), chunk.size());
    if (each)
      if (auto r = each(chunk); !r) return r.error();
    at += n;
  }
  return hash.digest();
}

}  // namespace neffcache::detail
