// Definitions of cache/layers.hpp (core/decl.hpp).
#pragma once

#include <neffcache/cache/layers.hpp>

#include <sys/stat.h>

#include <set>
#include <utility>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL std::string whiteout_of(std::string_view name) {
  return fmt::format("{}{}", k_whiteout_prefix, name);
}

NEFFCACHE_DECL std::optional<std::size_t> Layers::layer_of(std::string_view rel) const {
  struct stat st {};
  for (std::size_t k = 0; k < roots_.size(); ++k) {
    if (::lstat(fmt::format("{}/{}", roots_[k], rel).c_str(), &st) == 0) return k;
    if (k + 1 < roots_.size() && hides(k, rel)) return std::nullopt;
  }
  return std::nullopt;
}

NEFFCACHE_DECL std::string Layers::path(std::string_view rel) const {
  return fmt::format("{}/{}", roots_[roots_.size() == 1 ? 0 : layer_of(rel).value_or(0)], rel);
}

NEFFCACHE_DECL bool Layers::hides(std::size_t k, std::string_view rel) const {
  struct stat st {};
  for (std::size_t from = 0; from < rel.size();) {
    const auto slash = rel.find('/', from);
    const auto end = slash == std::string_view::npos ? rel.size() : slash;
    const std::string_view folder = rel.substr(0, from);  // "" or "a/b/"
    if (::lstat(fmt::format("{}/{}{}", roots_[k], folder, whiteout_of(rel.substr(from, end - from))).c_str(), &st) == 0)
      return true;
    if (!folder.empty() && ::lstat(fmt::format("{}/{}{}", roots_[k], folder, k_opaque_name).c_str(), &st) == 0)
      return true;
    from = end + 1;
  }
  return false;
}

NEFFCACHE_DECL Result<void> for_each_entry(const Layers& layers,
                                           const std::function<void(const LayerEntryRef&)>& visit) {
  std::set<std::string, std::less<>> seen;
  for (std::size_t k = 0; k < layers.size(); ++k) {
    const std::string& root = layers.roots()[k];
    auto r = for_each_entry(root, [&](const EntryRef& ref) {
      std::string rel = ref.relative_path();
      if (layers.size() > 1 && (seen.contains(rel) || layers.layer_of(rel) != k)) return;
      visit(LayerEntryRef{ref, k, root});
      if (layers.size() > 1) seen.insert(std::move(rel));
    });
    // A layer 0 that does not exist yet (a scratch or upper folder with nothing in it) has
    // no entries; the caller made sure of the folder itself.
    if (!r && !(k == 0 && layers.size() > 1 && r.error().code == Errc::not_found)) return r;
  }
  return {};
}

}  // namespace neffcache
