// XXH3-64 checksums: of bytes streamed through a state, of what a descriptor reads, and
// of a whole file. publish() records a NEFF's in .neffcache-meta.json; verify checks a NEFF
// against it; the content index checks its records with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#define XXH_INLINE_ALL
// Without xxhash's inlining hints under GCC: a unit built at -Og fails there, since GCC
// does not inline the functions that xxhash forces inline and calls through pointers.
// (Hashing 256 MiB took as long without them at -O2 and -O3 here: about 15 ms.)
#if defined(__GNUC__) && !defined(__clang__) && !defined(XXH_NO_INLINE_HINTS)
#define XXH_NO_INLINE_HINTS 1
#endif
#include <xxhash.h>

#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache::detail {

// An XXH3-64 state that frees itself: update() with bytes, then digest().
class Xxh3 {
 public:
  Xxh3() : state_(XXH3_createState()) { XXH3_64bits_reset(state_.get()); }
  void update(const void* data, std::size_t size) { XXH3_64bits_update(state_.get(), data, size); }
  uint64_t digest() const { return XXH3_64bits_digest(state_.get()); }

 private:
  struct Free {
    void operator()(XXH3_state_t* s) const { XXH3_freeState(s); }
  };
  std::unique_ptr<XXH3_state_t, Free> state_;
};

// The XXH3-64 of `bytes`.
inline uint64_t xxh3_64(std::string_view bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

// A checksum written as publish() records it and the content index compares it:
// 16 lowercase hex digits.
NEFFCACHE_DECL std::string xxh3_hex(uint64_t h);

// The xxh3 of what `fd` reads from its start to its end. Reads with pread, so the
// descriptor's offset is neither used nor moved: a descriptor shared with others (an
// index's checked NEFF) can be hashed again. `fd` stays the caller's. `each`, when
// given, is handed every chunk as it is hashed (a copy writes it on); an error it
// returns ends the loop and is returned. Errors: a read fails (named after `what`).
NEFFCACHE_DECL Result<uint64_t> fd_xxh3(int fd, const std::string& what,
                                        const std::function<Result<void>(std::string_view chunk)>& each = {});

// The xxh3 of a regular file's bytes, as publish() records it. Errors: the file cannot
// be opened as a regular file without following a link (see open_regular), or a read fails.
inline Result<uint64_t> file_xxh3(const std::string& path) {
  auto opened = open_regular(path);
  if (!opened) return opened.error();
  return fd_xxh3(opened->get(), path);
}

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/core/detail/xxh3.ipp>
#endif
