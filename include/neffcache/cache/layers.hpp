// Layers: one cache seen through several folders, as `neffcachefs --upper/--lower`
// mounts it (and a read-only cache under a private scratch folder). Layer 0 is the one
// written; the layers under it are read-only and are searched in order: a name is taken
// from the first layer that has it (first match wins).
//
// - Folders that hold entries (the root, neuronxcc-* folders) merge: their names are the
//   union of every layer's copy. An entry folder does not: an entry is taken whole from
//   the first layer that has it, so its state is never read from two layers.
// - A removal of a name that a lower layer still shows leaves a whiteout in layer 0's copy
//   of the folder: a file named k_whiteout_prefix + name, which hides that name (and all
//   below it) in every layer under the one holding the whiteout.
// - A folder made again over its whiteout is opaque (a file k_opaque_name in it): no layer
//   below shows anything in it, so a folder removed and made again starts empty.
// - Copies into layer 0 under way carry k_copy_up_prefix: never an entry, never listed.
//
// Nothing here writes: the daemon makes whiteouts and copies (fuse/namespace_layers.cpp), and a
// lower layer is never changed by anyone.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <neffcache/cache/layout.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/result.hpp>

namespace neffcache {

inline constexpr std::string_view k_whiteout_prefix = ".neffcache-wh.";
inline constexpr std::string_view k_copy_up_prefix = ".neffcache-up.";
inline constexpr std::string_view k_opaque_name = ".neffcache-opaque";

// Whether `name` is one of the layers' own files (a whiteout, an opaque folder's marker,
// a copy under way), which a mount never shows.
inline bool is_layer_name(std::string_view name) {
  return name.starts_with(k_whiteout_prefix) || name.starts_with(k_copy_up_prefix) || name == k_opaque_name;
}
// The whiteout that hides `name` in the layers below.
NEFFCACHE_DECL std::string whiteout_of(std::string_view name);

class Layers {
 public:
  // `top`: layer 0; `lowers`: the read-only layers under it, in search order. Absolute
  // paths without a trailing '/'.
  explicit Layers(std::string top, std::vector<std::string> lowers = {}) {
    roots_.push_back(std::move(top));
    for (auto& l : lowers) roots_.push_back(std::move(l));
  }
  const std::string& top() const { return roots_.front(); }
  const std::vector<std::string>& roots() const { return roots_; }
  std::size_t size() const { return roots_.size(); }

  // The layer that shows `rel` (a path below the root, such as an entry path): the first
  // whose copy has it, unless a layer above it hides it (or a folder on its way) with a
  // whiteout. nullopt: no layer shows it.
  std::optional<std::size_t> layer_of(std::string_view rel) const;

  // The path of `rel` in the layer that shows it; in layer 0 when none does (where it
  // would be made).
  std::string path(std::string_view rel) const;

 private:
  // Whether layer `k` hides `rel` from the layers below: a whiteout of it or of a folder
  // on its way, or an opaque folder on its way.
  bool hides(std::size_t k, std::string_view rel) const;

  std::vector<std::string> roots_;
};

// One entry of a layered walk: the entry as for_each_entry sees it, and its layer.
struct LayerEntryRef {
  const EntryRef& ref;
  std::size_t layer;
  const std::string& root;  // that layer's folder
};

// Calls `visit` for every entry the layers show (see Layers), each once, in the layer
// that shows it: layer 0's entries first, then those of each lower layer that no layer
// above has or hides. Errors as for_each_entry's for layer 0; a lower layer that cannot
// be read is an error too.
NEFFCACHE_DECL Result<void> for_each_entry(const Layers& layers,
                                           const std::function<void(const LayerEntryRef&)>& visit);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/cache/layers.ipp>
#endif
