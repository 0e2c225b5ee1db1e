// The "an input finished writing" policy (input_policy.hpp).
#include "input_policy.hpp"

#include <cstdlib>
#include <filesystem>
#include <optional>

#include <neffcache/core/detail/proc.hpp>
#include <neffcache/cache/flags.hpp>
#include <neffcache/cache/lock.hpp>
#include <neffcache/cache/layout.hpp>

#include "client_locks.hpp"
#include "entry_view.hpp"

namespace neffcachefs {

using namespace neffcache;

// An LNL entry's inputs: its HLO, its compile command and LNL's metadata (without which
// it is no job of ours: EntryFiles::has_job).
static bool is_lnl_input_name(std::string_view name) {
  return name == k_lnl_hlo_file || name == k_lnl_command_file || name == k_lnl_metadata_file;
}

bool InputPolicy::flush_may_cut(std::string_view name) const {
  return eager_ && (is_hlo_name(name) || is_lnl_input_name(name));
}

// Exiting (PF_EXITING in the flags of /proc/TID/stat, field 9) with a signal as its exit
// code (field 52).
bool InputPolicy::killed_while_exiting(pid_t tid) {
  constexpr unsigned long k_pf_exiting = 0x4;
  auto fields = tid > 0 ? detail::proc_stat_fields(tid) : std::nullopt;
  if (!fields || fields->size() < 52 - 2) return false;  // exit_code is shown to whoever may trace it
  auto number = [&](int field) { return std::strtoul((*fields)[static_cast<std::size_t>(field - 3)].c_str(), nullptr, 10); };
  return (number(9) & k_pf_exiting) && (number(52) & 0x7f) != 0;
}

void InputPolicy::mark_cut(uint64_t fh) {
  std::lock_guard lk(mu_);
  cut_.insert(fh);
}

bool InputPolicy::release_may_act(uint64_t fh, bool written, bool placeholder) {
  bool cut;
  {
    std::lock_guard lk(mu_);
    cut = cut_.erase(fh) > 0;
  }
  return (eager_ || s3_) && written && !placeholder && !cut;
}

InputAction InputPolicy::after_close(const std::string& path) const {
  if (path.empty()) return InputAction::none;
  std::filesystem::path p(path);
  const std::string name = p.filename().string();
  const std::string folder = p.parent_path().filename().string();
  // An LNL entry compiles (or, over S3 without eager compiles, goes up) once its inputs
  // are written (in any order), not on the first; never while a client holds the key's
  // lock: it compiles the entry itself, and its marker, written last, sends its result up.
  if (is_lnl_key(folder)) {
    if (s3_ && name == k_lnl_marker_file) return InputAction::upload;
    if (!(eager_ || s3_) || !is_lnl_input_name(name)) return InputAction::none;
    const std::string dir = p.parent_path().string();
    auto files = read_entry_files(dir);
    if (!files || !files->has_job() || files->done()) return InputAction::none;
    if (client_lock_held_at(AT_FDCWD, entry_lock_path(dir, *files), *files)) return InputAction::none;
    return eager_ ? InputAction::compile : InputAction::upload;
  }
  if (!folder.starts_with(k_module_dir_prefix)) return InputAction::none;
  // With an S3 cache the compile uploads the inputs first; without a compile they go up
  // alone. A client that compiled the entry itself writes model.done after its NEFF:
  // the NEFF goes up then.
  if (s3_ && name == k_done_file) return InputAction::upload;
  if (eager_ && is_hlo_name(name)) return InputAction::compile;
  if (s3_ && (is_hlo_name(name) || name == k_compile_flags_file)) return InputAction::upload;
  return InputAction::none;
}

InputAction InputPolicy::after_unlink(std::string_view name) const {
  // A client let go of its lock: what it wrote goes up, and what was held elsewhere for it
  // is given back (store::Remote::publish_written).
  return s3_ && ClientLocks::is_lock_name(std::string(name).c_str()) ? InputAction::upload : InputAction::none;
}

InputAction InputPolicy::after_rename(std::string_view name) const {
  // An LNL input renamed into place: the compile finds out whether the other is there.
  if (is_lnl_input_name(name)) return eager_ ? InputAction::compile : InputAction::none;
  // An HLO renamed into place is a finished write; so is a client's model.done.
  if (s3_ && name == k_done_file) return InputAction::upload;
  if (!is_hlo_name(name) || !(eager_ || s3_)) return InputAction::none;
  return eager_ ? InputAction::compile : InputAction::upload;
}

}  // namespace neffcachefs
