// Preparing an entry folder's job for the Scheduler: its size and dedup key, read from
// its HLO and flags. Kept out of the scheduler, which is a job engine and reads no
// entry: callers of a directory cache call prepare_job and give the scheduler the
// directory cache's "already settled?" rule, folder_settled (compile/compile.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/index.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/compile/scheduler.hpp>
#include <neffcache/compile/settings.hpp>
#include <neffcache/hlo/hlo.hpp>

namespace neffcache {

// Reads an entry's HLO and flags (compile_flags.json, else `default_flags`) to build its
// JobSpec. An unreadable HLO still gives a spec, keyed by the entry alone: its compile
// then records the failure in model.log. A done entry is not read either: submit answers
// it without a compile, so a key would be a whole HLO read and hashed for nothing.
// `compiler_version`: the version of the compiler that compiles it (compiler_version),
// which names an LNL entry's identity (none when empty: then the entry has no dedup key).
inline JobSpec prepare_job(const std::string& entry_dir, const std::vector<std::string>& default_flags = {},
                           std::string_view compiler_version = {}) {
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
