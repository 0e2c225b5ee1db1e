// The content index's rows of bench_mount (`--only twins`), in bench_twins.cpp.
#pragma once

#include <filesystem>
#include <vector>

#include "mount_bench.hpp"

namespace mount_bench {

struct TwinOptions {
  int reps = 5;
  uint64_t neff_mib = 1024;  // the done NEFF whose metadata twins are opened
  int graphs = 10, per_graph = 10;  // done graphs, and twins opened of each
  int records = 100000;      // records of the large index
  int lookups = 1000;        // timed lookups per repetition and index
};

// 1. The open of a metadata twin of a done NEFF until its first byte, against an open of
//    the done entry itself, and whether the twin's NEFF is a link of the original.
// 2. Compiles for `graphs` x `per_graph` twins of done graphs opened through a mount.
// 3. The index's lookup for a pending entry (a miss, and a hit without the publish)
//    with `records` records against an empty index; the open of a pending entry through
//    mounts with the index on and off.
// Works in folders below `work`; throws when a figure cannot be had.
std::vector<Row> bench_twins(const TwinOptions& o, const std::filesystem::path& work);

}  // namespace mount_bench
