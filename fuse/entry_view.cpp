// The entry view (entry_view.hpp).
#include "entry_view.hpp"

#include <fcntl.h>

#include <neffcache/lock.hpp>

namespace neffcachefs {

using namespace neffcache;

EntryStage entry_stage(const EntryFiles& files, bool client_lock_live) {
  if (!files.has_hlo()) return EntryStage::not_entry;
  if (files.done()) return EntryStage::done;
  if (client_lock_live) return EntryStage::client_compiling;
  // A record of a failure (the EntryFiles rule: model.log and no model.neff).
  if (files.failed()) return EntryStage::failed;
  return EntryStage::pending;
}

bool shows_placeholders(EntryStage stage) { return stage == EntryStage::pending || stage == EntryStage::failed; }

std::vector<std::string_view> placeholder_names(const EntryFiles& files, EntryStage stage) {
  std::vector<std::string_view> names;
  if (!shows_placeholders(stage)) return names;
  if (!files.has(EntryFile::neff)) names.push_back(k_neff_file);
  if (!files.has(EntryFile::done)) names.push_back(k_done_file);
  return names;
}

PlaceholderOpen placeholder_open(EntryStage stage, bool retry_failed) {
  return stage == EntryStage::failed && !retry_failed ? PlaceholderOpen::fail_recorded : PlaceholderOpen::compile;
}

bool shows_result(const EntryFiles& files, CompileOutcome outcome) {
  if (is_success(outcome)) return files.done();
  if (outcome == CompileOutcome::failed || outcome == CompileOutcome::failed_cached) return files.failed();
  return false;
}

bool is_product_name(std::string_view n) { return n == k_neff_file || n == k_done_file; }

bool is_hlo_name(std::string_view n) { return n == k_hlo_module_file || n == k_hlo_legacy_file; }

// An unmodified Neuron client compiles the entry itself when it holds a live
// existence-style lock (a lock file without our owner record). Other clients wait for
// that lock as they would on a plain directory.
bool client_compiling_at(int dir_fd, const EntryFiles& files) {
  if (!files.has_lock()) return false;
  auto lock = inspect_lock_at(dir_fd, files.lock_name());
  return lock && lock->state == LockState::live && !lock->owner;
}

EntryStage entry_stage_at(int dir_fd) {
  int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return EntryStage::not_entry;
  EntryFiles files;
  // list_dir takes the descriptor.
  auto listed = detail::list_dir(fd, "entry", [&](std::string_view name, bool) { files.note(name); });
  if (!listed) return EntryStage::not_entry;
  // The lock is inspected only where it matters (an HLO and no finished NEFF).
  return entry_stage(files, files.has_hlo() && !files.done() && client_compiling_at(dir_fd, files));
}

}  // namespace neffcachefs
