// Definitions of store/remote.hpp (core/decl.hpp).
#pragma once

#include <neffcache/store/remote.hpp>

#include <nlohmann/json.hpp>

namespace neffcache::store {

NEFFCACHE_DECL std::optional<nlohmann::ordered_json> Remote::counters() const { return std::nullopt; }

}  // namespace neffcache::store
