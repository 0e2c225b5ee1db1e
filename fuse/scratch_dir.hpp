// Over a read-only cache mounted without --upper, the lock files clients create go to a
// private folder of the daemon's (Options::scratch), gone with the daemon.
#pragma once

#include <string>

#include <neffcache/core/detail/fs.hpp>

namespace neffcachefs {

class ScratchDir {
 public:
  ScratchDir() = default;
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir();

  // Makes the folder in `tmp`, with the mode and owner of the cache at `cache` (the mount's
  // root shows them), after removing the folders of daemons that are gone. Returns the
  // error's line ("" on success).
  std::string make(const std::string& tmp, const std::string& cache);
  const std::string& path() const { return dir_; }

 private:
  std::string dir_;
  // flock'ed for the daemon's life (a fork keeps it): the folder of a daemon that is gone is
  // one nobody holds.
  neffcache::detail::UniqueFd held_;
};

}  // namespace neffcachefs
