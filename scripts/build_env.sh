# Sourced by the scripts that build (test.sh, fuzz.sh, bench/run.sh): compile through ccache
# when it is installed, set up so that a clone of this repository in any folder reuses what a
# clone elsewhere compiled from the same sources. The cache is ccache's own folder (its
# default, ~/.cache/ccache, unless CCACHE_DIR says otherwise), outside every clone; no build
# needs it to be warm. Defines `cmake_tools`, the options that give CMake ccache as the
# compiler launcher and mold as the linker, where they are installed.

# Absolute paths under the clone (sources, include folders, the unity files) are hashed, and
# given to the compiler, relative to the build folder.
CCACHE_BASEDIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
export CCACHE_BASEDIR
# On a miss, take the headers a unit read from the compiler's own dependency file (-MD, which
# CMake passes) instead of running the preprocessor once more.
export CCACHE_DEPEND=true
# Debug information names the build folder; CMakeLists.txt maps the clone's path away
# (-ffile-prefix-map), so the folder needs no place in the hash.
export CCACHE_NOHASHDIR=true
# Precompiled headers (the tests', the subcommands'): their timestamps and the macros they define are
# left out of the hash, which ccache needs to cache a unit that uses one. Our sources use no
# __DATE__ or __TIME__.
export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
# (The test command's builds take about 0.6 GB of the cache, ccache's 5 GB by default.)

cmake_tools=()
if command -v ccache >/dev/null; then
  cmake_tools+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
# mold, a faster linker than ld, for the large programs with debug information that the
# sanitizer builds link.
if command -v mold >/dev/null; then
  cmake_tools+=(-DCMAKE_EXE_LINKER_FLAGS=-fuse-ld=mold)
fi

# ccache's counters, to tell a build's hits from its misses: "hits misses".
ccache_counts() {
  if ! command -v ccache >/dev/null; then echo "0 0"; return; fi
  { ccache --print-stats 2>/dev/null || true; } | awk '
    $1 == "direct_cache_hit" || $1 == "preprocessed_cache_hit" { hits += $2 }
    $1 == "cache_miss" { misses += $2 }
    END { print hits + 0, misses + 0 }'
}
