// Definitions of compile/prepare.hpp (core/decl.hpp).
#pragma once

#include <neffcache/compile/prepare.hpp>

#include <utility>

#include <fmt/format.h>

namespace neffcache {

NEFFCACHE_DECL JobSpec prepare_job(const std::string& entry_dir, const std::vector<std::string>& default_flags,
                                   std::string_view compiler_version) {
  JobSpec spec{entry_dir, {}, 0};
  auto files = read_entry_files(entry_dir);
  if (!files || !files->has_job() || files->done()) return spec;
  auto hlo = analyze_hlo_file(fmt::format("{}/{}", entry_dir, *files->hlo_name()));
  if (!hlo) return spec;
  spec.instructions = hlo->stats.instructions;
  spec.hlo_bytes = hlo->stats.bytes;
  std::string compiler_dir;
  if (files->is_lnl()) {
    // Its identity names the version of the compiler that will compile it here.
    auto dir = lnl_identity_compiler_dir(entry_dir, *files, compiler_version);
    if (!dir) return spec;
    compiler_dir = std::move(*dir);
  } else {
    compiler_dir = compiler_dir_of(entry_dir);
  }
  auto flags = entry_compiler_flags(entry_dir, *files, default_flags);
  if (!flags) return spec;
  // The entry's content identity: what the content index files its result under.
  spec.dedup_key = ContentId{compiler_dir, hlo->canonical_sha256, flags_hash(*flags)}.str();
  return spec;
}

}  // namespace neffcache
