// The daemon's program: parses the command line, checks the ground, mounts and runs the FUSE
// loop until it stops. main.cpp only calls it, so that this code is compiled in the one unit of
// neffcachefs_parts (fuse/CMakeLists.txt), with the library code it shares with the other parts,
// instead of in a unit of its own that instantiates that code again.
#pragma once

namespace neffcachefs {

// Returns the process's exit status.
int run_daemon(int argc, char** argv);

}  // namespace neffcachefs
