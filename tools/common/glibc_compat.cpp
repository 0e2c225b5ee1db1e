// What lets the programs load on glibc 2.34 (Amazon Linux 2023) though they are built on a newer
// one, linked into each program of a NEFFCACHE_PORTABLE build (cmake/dependencies.cmake).
//
// arc4random: glibc 2.36 added it, and GCC 12's libstdc++.a refers to it from std::random_device,
// which every program links in with std::runtime_error (its strings of the old ABI bring the
// object that defines random_device's constructor). Nothing of ours calls it; the library's
// randomness is detail::random_u64, which this one gives too. Defined in the program, the
// reference binds here and not to glibc's GLIBC_2.36 version.
#include <cstdint>

#include <neffcache/core/detail/proc.hpp>

// Hidden: the program keeps it to itself, and shared libraries (glibc's own callers among them) go
// on using glibc's. (noexcept: a failure of getrandom, only on a kernel older than 3.17, ends
// the program, as glibc's arc4random would.)
extern "C" __attribute__((visibility("hidden"))) uint32_t arc4random() noexcept {
  return static_cast<uint32_t>(neffcache::detail::random_u64());
}
