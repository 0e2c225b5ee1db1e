// One policy for "an input finished writing": when a client's close or rename of an
// entry's input starts work in the background (an eager compile, or with an S3 cache an
// upload of the inputs), and when it must not (the writer was killed mid-write).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <mutex>
#include <set>
#include <string>
#include <string_view>

namespace neffcachefs {

enum class InputAction { none, compile, upload };

class InputPolicy {
 public:
  // `eager`: compile an HLO as soon as it is written through the mount. `s3`: the cache
  // is in S3 (inputs are uploaded even without a compile).
  InputPolicy(bool eager, bool s3) : eager_(eager), s3_(s3) {}

  // FLUSH of open file `fh` of `name`: whether its writer may have been cut short is
  // worth asking (an HLO, eager compiles). FLUSH carries no open flags.
  bool flush_may_cut(std::string_view name) const;
  // Whether thread `tid` is ending by a signal. The kernel sends the FLUSH of each file a
  // process had open in the context of its exiting thread, so this tells a client killed
  // in the middle of a write from one that closed the file.
  static bool killed_while_exiting(pid_t tid);
  // The writer of `fh` was killed while it had the file open.
  void mark_cut(uint64_t fh);

  // RELEASE of `fh`: forgets its mark, and says whether its close may start work (the
  // file was opened for writing, is not a placeholder, and its writer was not killed:
  // a file cut short could record a failure, or publish the NEFF of half a graph under
  // the whole graph's key).
  bool release_may_act(uint64_t fh, bool written, bool placeholder);
  // A client closed `path` after writing it: what to start for its entry.
  InputAction after_close(const std::string& path) const;
  // A client renamed a file to `name` in a folder: what to start for that folder.
  InputAction after_rename(std::string_view name) const;
  // A client removed `name` from a folder (or it died, and its lock file was removed for
  // it): what to start for that folder.
  InputAction after_unlink(std::string_view name) const;

 private:
  const bool eager_, s3_;
  // Rank 70 (docs/ARCHITECTURE.md): guards cut_. A leaf.
  std::mutex mu_;
  std::set<uint64_t> cut_;  // open files (by fh) whose writer was killed
};

}  // namespace neffcachefs
