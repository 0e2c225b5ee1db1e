// XXH3-64 checksums: of bytes streamed through a state, and of a whole file. publish()
// records a NEFF's in .neffcache-meta.json; verify checks a NEFF against it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#define XXH_INLINE_ALL
#include <xxhash.h>

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

// The xxh3 of a regular file's bytes, as publish() records it. Errors: the file cannot
// be opened as a regular file without following a link (see open_regular), or a read fails.
inline Result<uint64_t> file_xxh3(const std::string& path) {
  auto opened = open_regular(path);
  if (!opened) return opened.error();
  UniqueFd in = std::move(*opened);
  Xxh3 hash;
  std::vector<char> buf(1 << 20);
  for (;;) {
    ssize_t n = sys::read(in.get(), buf.data(), buf.size());
    if (n < 0) return sys_error("read", path);
    if (n == 0) break;
    hash.update(buf.data(), static_cast<std::size_t>(n));
  }
  return hash.digest();
}

}  // namespace neffcache::detail
