// A user's unit built at -Og with GCC, header-only (tests/CMakeLists.txt: header_only_og): GCC
// refuses there a function forced inline that it does not inline, as xxhash's were until
// core/detail/xxh3.hpp turned their hints off. So this unit calls what hashes with xxhash.
#include <neffcache/neffcache.hpp>

#include <cstdint>
#include <string_view>

uint64_t debug_build_hashes(std::string_view bytes, int fd) {
  neffcache::detail::Xxh3 state;
  state.update(bytes.data(), bytes.size());
  auto of_fd = neffcache::detail::fd_xxh3(fd, "fd");
  return state.digest() ^ neffcache::detail::xxh3_64(bytes) ^ (of_fd ? *of_fd : 0);
}
