// Sizes as people write them on command lines ("64G", "512MiB", "1T") and read them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include <neffcache/core/decl.hpp>

namespace neffcache {

// A byte count with an optional binary unit: B, K/KB/KiB, M/MB/MiB, G/GB/GiB, T/TB/TiB
// (all powers of 1024, any case). Empty, negative, unknown units and overflow: nullopt.
NEFFCACHE_DECL std::optional<uint64_t> parse_size(std::string_view s);

// "1.5 GiB", "12 KiB", "300 B".
NEFFCACHE_DECL std::string format_size(uint64_t bytes);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/core/size.ipp>
#endif
