// The artifact fake-neuronx-cc writes in place of a real NEFF: a small text header that
// names the graph, then optional padding, then a SHA-256 of everything before it, so a
// test can tell that the right NEFF landed in the right entry and that it is whole.
//
//   FAKE-NEFF v1
//   graph <canonical sha256 of the HLO>
//   flags <flags as a JSON list>
//   stats <format> <computations> <instructions>
//   padding <n>
//   <n bytes>
//   sha256 <64 hex digits>\n
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include <neffcache/core/detail/digest.hpp>

namespace neffcache::fake {

inline constexpr std::string_view k_magic = "FAKE-NEFF v1\n";
inline constexpr std::string_view k_trailer = "sha256 ";
inline constexpr std::size_t k_trailer_size = 7 + 64 + 1;

struct FakeNeff {
  std::string graph;  // canonical sha256 of the compiled HLO
  std::string flags;  // JSON list
};

// Checks magic and checksum; returns the graph and flags lines of a whole artifact,
// nothing for a partial or altered one.
inline std::optional<FakeNeff> parse_fake_neff(std::string_view bytes) {
  if (bytes.size() < k_magic.size() + k_trailer_size || bytes.substr(0, k_magic.size()) != k_magic)
    return std::nullopt;
  std::string_view body = bytes.substr(0, bytes.size() - k_trailer_size);
  std::string_view trailer = bytes.substr(body.size());
  auto sha = detail::Digest::sha256();
  sha.update(body);
  if (trailer != std::string(k_trailer) + sha.hex() + "\n") return std::nullopt;
  auto field = [&](std::string_view name) -> std::string {
    // Appended piece by piece: GCC 12's -Wrestrict misreads `"\n" + std::string(name)`
    // once inlined at -O2 and fails the Release build.
    std::string needle(1, '\n');
    needle.append(name).append(1, ' ');
    auto at = body.find(needle);
    if (at == std::string_view::npos) return {};
    at += name.size() + 2;
    return std::string(body.substr(at, body.find('\n', at) - at));
  };
  return FakeNeff{field("graph"), field("flags")};
}

}  // namespace neffcache::fake
