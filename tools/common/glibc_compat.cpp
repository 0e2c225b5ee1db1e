// What lets the programs load on glibc 2.34 (Amazon Linux 2023) though they are built on a newer
// one, linked into each program of a NEFFCACHE_PORTABLE build (cmake/dependencies.cmake).
//
// arc4random: glibc 2.36 added it, and GCC 12's libstdc++.a refers to it from std::random_device,
// which every program links in with std::runtime_error (its strings of the old ABI bring the
// object that defines random_device's constructor). Nothing of ours calls it; the library's
// randomness is detail::random_u64. Defined in the program, the reference binds here and not to
// glibc's GLIBC_2.36 version. glibc's own functions call their internal copy, never this one.
#include <sys/random.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>

extern "C" uint32_t arc4random() noexcept {
  uint32_t value = 0;
  while (::getrandom(&value, sizeof value, 0) != static_cast<ssize_t>(sizeof value)) {
    if (errno != EINTR) std::abort();  // (getrandom fails otherwise only on a kernel older than 3.17)
  }
  return value;
}
