// The entry view: the one rule for what a cache entry shows through the mount besides
// its backing files, in both dialects. Lookups and opens ask here.
//
// Clients look before they open: libneuronxla looks for model.done, then reads
// model.neff; an LNL rank stats graph.hlo, its NEFF and .compilation_complete and lists
// the folder for LNL's metadata. So a name a lookup finds must mean what it means on a
// disk, and a placeholder (a product the mount will make when it is opened) may stand
// only where nothing else could be read under that name:
//
//   stage              what the folder holds              the product names
//                                                         (model.neff, model.done; LNL:
//                                                         graph_<key>.neff, the marker)
//   not an entry       no HLO (LNL: no graph.hlo with     as on a disk
//                      LNL's metadata: a rank compiling
//                      it, or what a dead rank left)
//   pending            an input, no product file, no      placeholders, found by a lookup
//                      failure record, no client lock     and never listed: opening one
//                      (our own compile may be running)   compiles (or joins the compile)
//   partial            a product without the rest (a      as on a disk: a client sees a
//                      NEFF without its marker: what a    miss and compiles it again,
//                      killed copy or compile leaves; a   under its own lock
//                      marker without its NEFF)
//   unfinished         our own publish, interrupted       the NEFF as it is, a placeholder
//                      after its NEFF went in place (our  for the marker; the daemon
//                      record describes that NEFF), in a  finishes the publish in the
//                      folder the daemon may write        background (compile_entry
//                                                         checks the bytes, then writes
//                                                         the marker), as does an open
//                                                         of the marker
//   client compiling   a client's live lock (a flock on   as on a disk: the client makes
//                      LNL's <root>/.<key>...lock that     the products itself
//                      this process does not hold)
//   another compiler's a Neuron entry under neuronxcc-<v> as on a disk: its own client
//                      that our compiler does not report  compiles it (compiles_here)
//   done               the client's hit test holds        the real files
//   failed             model.log without model.neff (LNL: as on a disk (with
//                      our failure record, own_files)     --retry-failed: placeholders,
//                                                         whose open compiles again)
//
// Placeholders are not listed, so that what walks a folder (shutil.rmtree, copytree,
// os.walk, cp -a, rsync) gets a folder's answers and starts no compile: a listing shows
// the backing files alone. Their attributes are those the product will have, but the
// size (placeholder_attr).
//
// The unlink of a placeholder succeeds and removes nothing (fs_names.cpp): an LNL rank
// removes a dead holder's marker after exists() said it is there. An open that finds the
// entry failed after its lookup (a compile failed meanwhile) answers EIO (03) at once
// (placeholder_open).
#pragma once

#include <sys/stat.h>

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <neffcache/cache/layout.hpp>
#include <neffcache/compile/outcome.hpp>

namespace neffcachefs {

enum class EntryStage { not_entry, pending, partial, unfinished, client_compiling, another_compiler, done, failed };

// The stage of a folder with files `files`: what the mount shows of its state (classify,
// cache/layout.hpp); `client_lock_live`: its lock file is held by a live client that is
// not a neffcache compile (client_lock_held_at, cache/lock.hpp); `ours`: our compiler may compile it
// (compiles_here).
EntryStage entry_stage(const neffcache::EntryFiles& files, bool client_lock_live, bool ours);

// Whether the compiler that serves the folder `compiler_dir` (Options::compiler_dir) may
// compile the entry at `entry_dir` (compiler_dir_serves, compile/settings.hpp); nullopt:
// compiles are off, and every entry is treated as ours.
bool compiles_here(std::string_view entry_dir, const std::optional<std::string>& compiler_dir);

// Whether a folder at this stage shows placeholders for its products: a pending one; a
// failed one only when failures are retried (`retry_failed`); an unfinished one, its marker.
bool shows_placeholders(EntryStage stage, bool retry_failed);

// The product names a lookup finds as placeholders in a folder with files `files` at
// `stage`: none beside a product file, but the marker beside our own NEFF (unfinished).
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
// is read (placeholder_at decides).
bool is_product_name(std::string_view name);
// Whether `name` is an entry's HLO (model.hlo_module.pb or the legacy name).
bool is_hlo_name(std::string_view name);

// Reading the backing folder `dir_fd` (an O_PATH or directory descriptor), a plain look:
// nothing is written, nothing locked.
// The stage of its files `files` (listed by the caller; `path`: the folder's), for a
// compiler of `compiler_dir`: the one rule that lookups, listings and opens apply. Only a
// folder the daemon may write (`writable`: layer 0 of a mount that is no scratch folder
// over a read-only cache) is ever unfinished: what a lower layer holds stays as it is.
EntryStage entry_stage_at(int dir_fd, const std::string& path, const neffcache::EntryFiles& files,
                          const std::optional<std::string>& compiler_dir, bool writable);
// Its files, path and stage (nullopt when it cannot be listed).
struct EntryLook {
  neffcache::EntryFiles files;
  std::string path;
  EntryStage stage = EntryStage::not_entry;
};
std::optional<EntryLook> look_at(int dir_fd, const std::optional<std::string>& compiler_dir, bool writable);
// Its stage alone (not_entry when it cannot be listed).
EntryStage entry_stage_at(int dir_fd, const std::optional<std::string>& compiler_dir, bool writable);
// The attributes of the placeholder `name` of the folder `dir_fd` seen as `look` (nullopt:
// `name` is none): those its product will have once published, with `umask` the daemon's
// (what its publishes lose), but the size.
std::optional<struct stat> placeholder_attr(int dir_fd, const EntryLook& look, std::string_view name,
                                            bool retry_failed, mode_t umask);

}  // namespace neffcachefs
