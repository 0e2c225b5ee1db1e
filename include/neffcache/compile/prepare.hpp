// Preparing an entry folder's job for the Scheduler: its size and dedup key, read from
// its HLO and flags. Kept out of the scheduler, which is a job engine and reads no
// entry: callers of a directory cache call prepare_job and give the scheduler the
// directory cache's "already settled?" rule, folder_settled (compile/compile.hpp).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/index.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/compile/scheduler.hpp>
#include <neffcache/compile/settings.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/hlo/hlo.hpp>

namespace neffcache {

// Reads an entry's HLO and flags (compile_flags.json, else `default_flags`) to build its
// JobSpec. An unreadable HLO still gives a spec, keyed by the entry alone: its compile
// then records the failure in model.log. A done entry is not read either: submit answers
// it without a compile, so a key would be a whole HLO read and hashed for nothing.
// `compiler_version`: the version of the compiler that compiles it (compiler_version),
// which names an LNL entry's identity (none when empty: then the entry has no dedup key).
NEFFCACHE_DECL JobSpec prepare_job(const std::string& entry_dir, const std::vector<std::string>& default_flags = {},
                                   std::string_view compiler_version = {});

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/prepare.ipp>
#endif
