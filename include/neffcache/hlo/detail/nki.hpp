// NKI kernels an HLO calls by file. A graph that calls an NKI kernel names the kernel's
// compiled binary by absolute path in the custom call's backend_config: base64 of a JSON
// object whose klir_binary.binary is the path (under /var/tmp/nki-intermediate-cache by
// default). neuronx-cc reads that file; a host without it fails the compile
// (NCC_EVRF059), so a cache shared between hosts must carry it.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <neffcache/core/decl.hpp>

namespace neffcache::detail {

// Decodes standard base64 (with '=' padding); nullopt for anything else.
NEFFCACHE_DECL std::optional<std::string> base64_decode(std::string_view text);

// The kernel binary an instruction's backend_config names (klir_binary.binary of its
// JSON, base64-encoded or plain); nullopt when it names none.
NEFFCACHE_DECL std::optional<std::string> nki_kernel_path(std::string_view backend_config);

}  // namespace neffcache::detail

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/hlo/detail/nki.ipp>
#endif
