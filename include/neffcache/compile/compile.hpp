// Compiling one cache entry folder, in the steps of every compile (compile/pipeline.hpp):
// the compiler run in a private work folder under the entry lock, its outcome classified
// (compile/outcome.hpp) and its NEFF published atomically (compile/publish.hpp). Results
// reused across equal graphs: compile/twin.hpp.
//
// Files of our own a job writes (own_files, layout.hpp: in a Neuron entry, in the cache's
// own folder for an LNL entry), besides the entry's products:
//   compile log             the compiler's output, streamed; becomes the failure record
//                           (model.log) only on a deterministic failure, so a half-written
//                           log never reads as "failed" to Neuron clients
//   record                  written before the NEFF goes in place (cache/record.hpp):
//                           size, xxh3, inode and mtime, command, flags,
//                           compile time, the peak memory of the compiler's process
//                           tree (peak_rss_kib), the memory reservation it was admitted
//                           with (predicted_peak_kib, 0: none) and how many earlier
//                           attempts were killed for lack of memory (oom_retries); the
//                           last two always written, from CompileSettings
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/core/clock.hpp>
#include <neffcache/core/decl.hpp>
#include <neffcache/core/detail/fs.hpp>
#include <neffcache/core/detail/sys.hpp>
#include <neffcache/core/detail/proc.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/lnl.hpp>
#include <neffcache/cache/layout.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/core/result.hpp>
#include <neffcache/compile/outcome.hpp>
#include <neffcache/compile/pipeline.hpp>
#include <neffcache/compile/publish.hpp>
#include <neffcache/compile/runner.hpp>
#include <neffcache/compile/settings.hpp>
#include <neffcache/hlo/hlo.hpp>

namespace neffcache {

namespace detail {

// The last `max` bytes of what was written to `fd` from offset `from` on.
NEFFCACHE_DECL std::string read_tail(int fd, off_t from, std::size_t max);

NEFFCACHE_DECL void log_line(int fd, std::string_view line);
}  // namespace detail

// The directory cache's "already settled?" rule, which a Scheduler is given
// (Scheduler::Options::settled): what the files of the entry folder `entry_dir` say of it
// (settled_outcome, failures kept unless s.retry_failed); nullopt when they say nothing
// yet or the folder cannot be read, so that the compile finds out. Lists the folder only.
NEFFCACHE_DECL std::optional<CompileOutcome> folder_settled(const std::string& entry_dir, const CompileSettings& s);

// The result of a job that needs a compile while compiles are off (compiles_off).
NEFFCACHE_DECL CompileResult& refused(CompileResult& r, std::string_view entry, const CompileSettings& s);

// Compiles one entry folder if it needs it. Never throws and never blocks on another
// holder: a held lock is CompileOutcome::busy. See CompileOutcome for what each result
// leaves behind; no outcome leaves a partial model.neff or a lock file.
NEFFCACHE_DECL CompileResult compile_entry(const std::string& entry_dir, const CompileSettings& s);

}  // namespace neffcache

#ifndef NEFFCACHE_SEPARATE_COMPILATION
#include <neffcache/compile/compile.ipp>
#endif
