// Definitions of hlo/hlo.hpp (core/decl.hpp).
#pragma once

#include <neffcache/hlo/hlo.hpp>

#include <limits>
#include <utility>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL Result<HloAnalysis> analyze_hlo(std::string_view bytes, const CanonicalSink& dump) {
  using namespace detail::hlo;
  if (bytes.size() > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    return Error{Errc::bad_hlo, fmt::format("HLO of {} bytes is larger than 2 GiB", bytes.size())};
  if (bytes.empty()) return Error{Errc::bad_hlo, "empty file, not an HLO module"};

  const std::string header = fmt::format("neffcache canonical hlo v{}\n", k_canonical_version);
  struct Attempt {
    bool ok = false;
    Stats stats;
    std::string sha256, error;
    int offset = -1;
  };
  auto attempt = [&](Msg top, bool emit) {
    auto sha = detail::Digest::sha256();
    auto send = [&](std::string_view piece) {
      sha.update(piece);
      if (emit && dump) dump(piece);
    };
    send(header);
    Canonicalizer c(bytes, send);
    Attempt a;
    a.ok = c.run(top);
    if (a.ok) a.stats = c.stats(), a.sha256 = sha.hex();
    else a.error = c.error(), a.offset = c.error_offset();
    return a;
  };

  // An HloProto's field 1 is the module; in a bare module field 1 is the name, which
  // never parses as a module with computations. Try the wrapper first, without
  // emitting text for a format that may be rejected; emit on a second pass if needed.
  HloFormat format = HloFormat::hlo_proto;
  Attempt a = attempt(Msg::hlo_proto, false);
  if (a.ok && dump) a = attempt(Msg::hlo_proto, true);
  if (!a.ok) {
    format = HloFormat::hlo_module;
    a = attempt(Msg::module, true);
    if (!a.ok)
      return Error{Errc::bad_hlo,
                   fmt::format("not a readable HLO module (at byte {}: {})", a.offset, a.error)};
  }

  HloAnalysis out;
  const auto& s = a.stats;
  out.stats.format = format;
  out.stats.bytes = bytes.size();
  out.stats.computations = s.computations;
  out.stats.instructions = s.instructions;
  out.stats.entry_parameters = s.entry_parameters;
  out.stats.opcodes = s.opcodes;
  out.stats.framework_ops = s.framework_ops;
  out.stats.kernel_files = s.kernel_files;
  out.canonical_sha256 = std::move(a.sha256);
  out.graph_hash = out.canonical_sha256.substr(0, k_graph_hash_digits);
  return out;
}

NEFFCACHE_DECL Result<HloAnalysis> analyze_hlo_file(const std::string& path, const CanonicalSink& dump) {
  auto bytes = detail::read_file(path);
  if (!bytes) return bytes.error();
  auto r = analyze_hlo(*bytes, dump);
  if (!r) return Error{r.error().code, fmt::format("{}: {}", path, r.error().message)};
  return r;
}

}  // namespace neffcache
