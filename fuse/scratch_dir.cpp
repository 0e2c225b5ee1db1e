// The private folder of a mount over a read-only cache (scratch_dir.hpp).
#include "scratch_dir.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string_view>

#include <fmt/format.h>

namespace neffcachefs {

namespace {

constexpr std::string_view k_scratch_prefix = "neffcachefs-locks-";

// Removes the scratch folders in `tmp` whose daemon is gone (kill -9, a crash): nobody
// holds their flock. Their lock files locked nothing since.
void sweep_scratch_dirs(const std::string& tmp) {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(tmp, ec)) {
    if (!e.path().filename().string().starts_with(k_scratch_prefix) || !e.is_directory(ec)) continue;
    neffcache::detail::UniqueFd dir(::open(e.path().c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (dir && ::flock(dir.get(), LOCK_EX | LOCK_NB) == 0) std::filesystem::remove_all(e.path(), ec);
  }
}

}  // namespace

ScratchDir::~ScratchDir() {
  std::error_code ignored;
  if (!dir_.empty()) std::filesystem::remove_all(dir_, ignored);
}

std::string ScratchDir::make(const std::string& tmp, const std::string& cache) {
  sweep_scratch_dirs(tmp);
  std::string dir = fmt::format("{}/{}XXXXXX", tmp, k_scratch_prefix);
  if (!::mkdtemp(dir.data())) return fmt::format("cannot create {}: {}", dir, std::strerror(errno));
  dir_ = dir;
  held_ = neffcache::detail::UniqueFd(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!held_ || ::flock(held_.get(), LOCK_EX | LOCK_NB) != 0)
    return fmt::format("cannot lock {}: {}", dir, std::strerror(errno));
  struct stat root {};
  if (::stat(cache.c_str(), &root) != 0 || ::chmod(dir.c_str(), root.st_mode & 07777) != 0 ||
      (::geteuid() == 0 && ::chown(dir.c_str(), root.st_uid, root.st_gid) != 0))
    return fmt::format("cannot give {} the mode and owner of {}: {}", dir, cache, std::strerror(errno));
  return "";
}

}  // namespace neffcachefs
