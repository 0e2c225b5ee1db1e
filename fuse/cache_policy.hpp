// What the kernel may keep of what the mount shows: one place decides it from what a node
// is, and says why each choice is safe.
//
//   node          names, attributes     an open's pages          why
//   special       not kept              direct I/O               the counters are a new
//   (stats.json)                                                 snapshot at every open
//   placeholder   not kept              direct I/O               a zero-size stand-in that
//                                                                becomes the real file when
//                                                                its compile ends
//   finished      a day                 kept across opens, and   a done entry's files never
//   (a done                             no FLUSH at a reader's   change while it exists (a
//   entry's)                            close                    publish renames new inodes
//                                                                into place)
//   plain         one second            the kernel's default     other processes change the
//                                                                backing folder too
//   listing       kept across opendirs, unless the mount has     only our own handlers change
//                 layers                                         a folder of a single layer
//
// An open that passes through (its answer names a backing file, passthrough.hpp) keeps no
// pages of its own: they are the backing file's, and the kernel fails such an open with EIO
// when its answer asks to keep the cache as well.
//
// Should a done entry be removed or repaired behind the daemon's back, opening a name the
// kernel kept finds its file unlinked and answers ESTALE, so the kernel looks it up again.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

namespace neffcachefs {

enum class NodeKind { special, placeholder, finished, plain };

// How long the kernel may keep a node's name and attributes, in seconds.
inline double cache_timeout(NodeKind kind) {
  switch (kind) {
    case NodeKind::special:
    case NodeKind::placeholder:
      return 0;
    case NodeKind::finished:
      return 86400;
    case NodeKind::plain:
      break;
  }
  return 1;
}

// Sets what the kernel may keep of an open of a node: direct I/O for the special files
// and placeholders; a finished file's pages, and no FLUSH, for a reader; no pages kept
// across opens for one that `passes_through`.
inline void set_open_caching(fuse_file_info& fi, NodeKind kind, bool reading, bool passes_through = false) {
  fi.direct_io = kind == NodeKind::special || kind == NodeKind::placeholder;
  fi.keep_cache = reading && kind == NodeKind::finished && !passes_through;
  fi.noflush = reading && kind == NodeKind::finished;
}

// Sets what the kernel may keep of an opened folder's listing.
inline void set_listing_caching(fuse_file_info& fi, bool layered) {
  fi.cache_readdir = !layered;
  fi.keep_cache = !layered;
}

}  // namespace neffcachefs
