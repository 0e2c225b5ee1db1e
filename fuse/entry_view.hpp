// The entry view: the one rule for what a cache entry shows through the mount besides
// its backing files. Lookups, listings and opens all ask here.
//
//   stage              model.neff / model.done      open of a placeholder
//                      (LNL: graph_<key>.neff /
//                      .compilation_complete)
//   no HLO             nothing of ours              -
//   (LNL: no job, graph.hlo without LNL's metadata: a rank compiling it)
//   pending            placeholders for the missing  compiles (or joins the compile)
//   client compiling   nothing (a client's live lock without our owner record: it
//                      creates model.neff itself, which a placeholder would refuse;
//                      LNL: a flock on <root>/.<key>.compilation_metadata.lock that
//                      this process does not hold)
//   another compiler's nothing of ours (a Neuron  -
//                      entry under neuronxcc-<v>
//                      whose <v> our compiler does
//                      not report: compiler_serves;
//                      its client compiles it)
//   done               the real files                -
//   failed (model.log) nothing (as on a disk: a     -
//                      status tool or libneuronxla
//                      reads it as failed); with
//                      --retry-failed, placeholders  compiles again
//
// The unlink of a placeholder succeeds and removes nothing (fs_names.cpp): an LNL rank
// removes a dead holder's marker after exists() said it is there.
//
// Lookups and listings show the same names. An open that finds the entry failed after
// its lookup (a compile failed meanwhile) answers EIO (03) at once (placeholder_open).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/layout.hpp>
#include <neffcache/compile/outcome.hpp>

namespace neffcachefs {

enum class EntryStage { not_entry, pending, client_compiling, another_compiler, done, failed };

// The stage of a folder with files `files`: what the mount shows of its state (classify,
// cache/layout.hpp); `client_lock_live`: its lock file is held by a live client that is
// not a neffcache compile (client_lock_held_at, cache/lock.hpp); `ours`: our compiler may compile it
// (compiles_here).
EntryStage entry_stage(const neffcache::EntryFiles& files, bool client_lock_live, bool ours);

// Whether the compiler that serves the folder `compiler_dir` (Options::compiler_dir; empty:
// none; nullopt: compiles are off, and every entry is treated as ours) may compile the
// entry at `entry_dir`: an LNL entry, or one of that folder.
bool compiles_here(std::string_view entry_dir, const std::optional<std::string>& compiler_dir);

// Whether a folder at this stage shows placeholders for its missing products: a pending
// one; a failed one only when failures are retried (`retry_failed`).
bool shows_placeholders(EntryStage stage, bool retry_failed);

// The product names to list beside the folder's own files (those it lacks).
std::vector<std::string> placeholder_names(const neffcache::EntryFiles& files, EntryStage stage, bool retry_failed);

// What the open of a placeholder does at this stage.
enum class PlaceholderOpen { compile, fail_recorded };
PlaceholderOpen placeholder_open(EntryStage stage, bool retry_failed);

// Whether a folder with files `files` still shows a compile's result `outcome`: a
// finished NEFF for a success, the record of a failure (model.log; LNL: our record) for
// a failure; nothing else is shown.
bool shows_result(const neffcache::EntryFiles& files, neffcache::CompileOutcome outcome);

// Whether `name` may be a product a placeholder stands for (model.neff, model.done;
// LNL's graph_<key>.neff, .compilation_complete): a check by name alone, before a folder
// is read (is_placeholder_at decides).
bool is_product_name(std::string_view name);
// Whether `name` is an entry's HLO (model.hlo_module.pb or the legacy name).
bool is_hlo_name(std::string_view name);

// Reading the backing folder `dir_fd` (an O_PATH or directory descriptor):
// the stage of its files `files` (listed by the caller; `path`: the folder's), for a
// compiler of `compiler_dir`: the one rule that lookups, listings and opens apply,
EntryStage entry_stage_at(int dir_fd, const std::string& path, const neffcache::EntryFiles& files,
                          const std::optional<std::string>& compiler_dir);
// its files, path and stage (nullopt when it cannot be listed),
struct EntryLook {
  neffcache::EntryFiles files;
  std::string path;
  EntryStage stage = EntryStage::not_entry;
};
std::optional<EntryLook> look_at(int dir_fd, const std::optional<std::string>& compiler_dir);
// its stage alone (not_entry when it cannot be listed),
EntryStage entry_stage_at(int dir_fd, const std::optional<std::string>& compiler_dir);
// and whether a lookup of `name` in it finds a placeholder.
bool is_placeholder_at(int dir_fd, std::string_view name, bool retry_failed,
                       const std::optional<std::string>& compiler_dir);

}  // namespace neffcachefs
