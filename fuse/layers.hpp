// Layers as the daemon serves them (the library's rules: neffcache/cache/layers.hpp). The
// backing folder is layer 0, the only one written; read-only layers lie under it
// (--lower, and BACKING itself under --upper), and a name is taken from the first layer
// that has it. Over a read-only cache without an upper layer, layer 0 is a private
// scratch folder that takes only the lock files that clients create (Options::scratch).
//
// What the namespace adds (namespace_layers.cpp):
// - A change to something in a lower layer first copies it up into layer 0: a file by
//   itself, a folder as an empty folder (its lower names still merge in), a file of an
//   entry or the entry itself as the whole entry. A compile of a lower pending entry
//   copies the entry up and compiles there.
// - A removal of a name that a lower layer still has leaves a whiteout in layer 0's copy
//   of the folder; creating the name again removes the whiteout.
// - A rename or hard link of something in a lower layer answers EXDEV (mv then copies
//   and removes, as across file systems).
// - Nothing in a lower layer is ever written: no stale lock is removed there either.
#pragma once

#include <string>
#include <string_view>

#include <neffcache/cache/layers.hpp>
#include <neffcache/cache/layout.hpp>

namespace neffcachefs {

using neffcache::is_layer_name;
using neffcache::k_whiteout_prefix;
using neffcache::whiteout_of;

// Whether the folder at `rel` (below the root) is an entry, taken whole from one layer.
inline bool is_whole_folder(const std::string& rel) { return neffcache::is_entry_path(rel); }

// Whether the scratch layer of a read-only cache takes a file of this name: the cache's
// lock (<root>/lock), an entry's lock (<hlo>.lock), LNL's .<key>.compilation_metadata.lock
// and the holder file beside it, .<key>.compilation_metadata.
inline bool is_lock_file_name(std::string_view name) {
  return name == "lock" || name.ends_with(neffcache::k_lock_suffix) ||
         (name.starts_with('.') && name.ends_with(neffcache::k_lnl_holder_suffix));
}

}  // namespace neffcachefs
