// The entry view (entry_view.hpp).
#include "entry_view.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <neffcache/cache/lock.hpp>
#include <neffcache/compile/publish.hpp>
#include <neffcache/compile/settings.hpp>

#include "inode_table.hpp"

namespace neffcachefs {

using namespace neffcache;

EntryStage entry_stage(const EntryFiles& files, bool client_lock_live, bool ours) {
  if (!files.has_job()) return EntryStage::not_entry;
  // The entry's state by the library's one rule (classify: a finished NEFF first, then a
  // lock, then a recorded failure, then a product without the rest), its lock judged as
  // a client's; what the mount shows of each state follows.
  const EntryState state = classify(files, [&] { return client_lock_live; });
  if (state == EntryState::done) return EntryStage::done;
  if (!ours) return EntryStage::another_compiler;
  switch (state) {
    case EntryState::compiling:
      return EntryStage::client_compiling;
    case EntryState::failed:
      return EntryStage::failed;
    case EntryState::partial:
      return EntryStage::partial;
    case EntryState::stale_lock:
      // A lock no client holds (ours, or a dead one's) is no lock to the mount: the entry
      // is what its other files say.
      return files.failed() ? EntryStage::failed : files.partial() ? EntryStage::partial : EntryStage::pending;
    default:
      return EntryStage::pending;
  }
}

bool shows_placeholders(EntryStage stage, bool retry_failed) {
  return stage == EntryStage::pending || stage == EntryStage::unfinished ||
         (stage == EntryStage::failed && retry_failed);
}

std::vector<std::string> placeholder_names(const EntryFiles& files, EntryStage stage, bool retry_failed) {
  // Our own NEFF, whole (a crash came between its rename and its marker): the marker it
  // lacks, which the daemon writes once it has checked the NEFF's bytes.
  if (stage == EntryStage::unfinished) return {std::string(files.done_name())};
  // Beside any other product file a placeholder would make a client take what is there
  // for a whole result (a marker beside a leftover NEFF); the folder is shown as it is.
  if (!shows_placeholders(stage, retry_failed) || files.has_product()) return {};
  return {files.neff_name(), std::string(files.done_name())};
}

PlaceholderOpen placeholder_open(EntryStage stage, bool retry_failed) {
  return stage == EntryStage::failed && !retry_failed ? PlaceholderOpen::fail_recorded : PlaceholderOpen::compile;
}

bool shows_result(const EntryFiles& files, CompileOutcome outcome) {
  if (is_success(outcome)) return files.done();
  if (outcome == CompileOutcome::failed || outcome == CompileOutcome::failed_cached) return files.failed();
  return false;
}

bool is_product_name(std::string_view n) {
  if (n == k_neff_file || n == k_done_file || n == k_lnl_marker_file) return true;
  return lnl_neff_key(n).has_value();
}

bool is_hlo_name(std::string_view n) { return n == k_hlo_module_file || n == k_hlo_legacy_file; }

bool compiles_here(std::string_view entry_dir, const std::optional<std::string>& compiler_dir) {
  return !compiler_dir || compiler_dir_serves(entry_dir, *compiler_dir);
}

// The files of the folder `dir_fd`, of the dialect its name says (nullopt when it cannot
// be listed), and its path.
static std::optional<EntryFiles> files_at(int dir_fd, std::string& path) {
  int fd = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  path = path_of_fd(fd);
  // An LNL entry is known by its folder's name (a key), which names its NEFF too.
  EntryFiles files = EntryFiles::of_entry_path(path);
  // list_dir takes the descriptor.
  auto listed = detail::list_dir(fd, "entry", [&](std::string_view name, bool) { files.note(name); });
  if (!listed) return std::nullopt;
  note_own_files(dir_fd, files);
  return files;
}

EntryStage entry_stage_at(int dir_fd, const std::string& path, const EntryFiles& files,
                          const std::optional<std::string>& compiler_dir, bool writable) {
  // The lock is inspected and the compiler's folder compared only where they matter (a
  // job and no finished NEFF).
  const bool open_job = files.has_job() && !files.done();
  const bool ours = !open_job || compiles_here(path, compiler_dir);
  // An unmodified client compiles the entry itself while it holds the lock; other clients
  // wait for that lock as they would on a plain directory.
  const EntryStage stage =
      entry_stage(files, open_job && ours && client_lock_held_at(dir_fd, files.lock_name(), files), ours);
  // A NEFF without its marker that our record describes is ours (a stat and the record;
  // its bytes are checked where the publish is finished, never in a handler).
  return stage == EntryStage::partial && writable && publish_interrupted(path, files) ? EntryStage::unfinished : stage;
}

std::optional<EntryLook> look_at(int dir_fd, const std::optional<std::string>& compiler_dir, bool writable) {
  EntryLook look;
  auto files = files_at(dir_fd, look.path);
  if (!files) return std::nullopt;
  look.files = std::move(*files);
  look.stage = entry_stage_at(dir_fd, look.path, look.files, compiler_dir, writable);
  return look;
}

EntryStage entry_stage_at(int dir_fd, const std::optional<std::string>& compiler_dir, bool writable) {
  auto look = look_at(dir_fd, compiler_dir, writable);
  return look ? look->stage : EntryStage::not_entry;
}

std::optional<struct stat> placeholder_attr(int dir_fd, const EntryLook& look, std::string_view name,
                                            bool retry_failed, mode_t umask) {
  bool found = false;
  for (const auto& n : placeholder_names(look.files, look.stage, retry_failed)) found = found || n == name;
  if (!found) return std::nullopt;
  // What the product will have once published (compile/publish.hpp): its mode less the
  // daemon's umask; the HLO's owner when the daemon is root (entry_owner), else the
  // daemon's (and a set-group-ID folder's group); the HLO's times. Only its size differs.
  struct stat st {}, hlo {}, dir {};
  const auto hlo_name = look.files.hlo_name();
  if (!hlo_name || ::fstatat(dir_fd, std::string(*hlo_name).c_str(), &hlo, AT_SYMLINK_NOFOLLOW) != 0) return std::nullopt;
  const bool neff = name == look.files.neff_name();
  st.st_mode = S_IFREG | ((neff ? detail::k_neff_mode : detail::k_marker_mode) & ~umask);
  st.st_nlink = 1;
  if (::geteuid() == 0) {
    st.st_uid = hlo.st_uid;
    st.st_gid = hlo.st_gid;
  } else {
    st.st_uid = ::geteuid();
    st.st_gid = ::fstatat(dir_fd, "", &dir, AT_EMPTY_PATH) == 0 && (dir.st_mode & S_ISGID) ? dir.st_gid : ::getegid();
  }
  st.st_atim = st.st_mtim = st.st_ctim = hlo.st_mtim;
  st.st_blksize = hlo.st_blksize;
  return st;
}

}  // namespace neffcachefs
