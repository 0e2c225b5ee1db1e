// neffcache-cc's parts (see main.cpp): the real compiler, found, asked its version, run
// and run in our place (real_compiler.cpp).
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include <neffcache/core/result.hpp>

namespace neffcache::shim {

inline constexpr const char* k_me = "neffcache-cc";
inline constexpr const char* k_compiler_name = "neuronx-cc";

// The real compiler: $NEFFCACHE_REAL_COMPILER (a path, or a name looked up on PATH),
// else the first neuronx-cc on PATH that is not this program (`self`, a canonical path).
// Never this program.
Result<std::string> find_real_compiler(const std::string& self);

// The canonical path of `p`; empty when it cannot be resolved.
std::string real_path(const std::string& p);

// Notes the descriptors this process was started with (the caller's, which the real compiler
// inherits as it would without us). Called first thing in main.
void note_inherited_descriptors();

// Replaces this process by the real compiler with our arguments, unchanged. Like run_real, it
// hands on only the descriptors we were started with: not what this process opened since
// (connections to a bucket, whatever libcurl makes them with).
[[noreturn]] void exec_real(const std::string& real, int argc, char** argv);

// Says why on one line of stderr, then exec_real: a compile the cache cannot serve.
[[noreturn]] void run_without_cache(const std::string& real, int argc, char** argv, std::string_view why);

// Runs the real compiler with the caller's arguments, stdio shared, in our process group
// (so a Ctrl-C reaches it as it would without us); it inherits `inherit_fd` (-1: none).
// Returns the exit status the caller should see (128 + signal for a signal).
int run_real(const std::string& real, int argc, char** argv, int inherit_fd);

// The real compiler's version, asked once per build of it: remembered in the folder
// `state` under the identity of the compiler's file (path, inode, size, times).
Result<std::string> compiler_version(const std::string& real, const std::string& state);

}  // namespace neffcache::shim
