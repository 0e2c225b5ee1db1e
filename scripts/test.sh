#!/usr/bin/env bash
# bash scripts/test.sh [--quick]
#
# Installs what is missing, builds, and runs every test: in a normal build, under
# AddressSanitizer + UndefinedBehaviorSanitizer, and the concurrency tests under
# ThreadSanitizer; then each fuzz target for a bounded time. Exit status: 0 only if all
# pass. At the end, pass or fail, a table gives each stage's wall time and each build's
# ccache hits.
#
# --quick is for the edit loop: one unoptimized, uninstrumented build (build-quick/) and
# its tests but the six slowest. It is no substitute for the whole run, which CI makes.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
# The tests wait for a third of their time (on the processes, mounts and radosgw they start):
# the Release stage's took 232 s of CPU in 189 s of wall on 2 cores. Twice as many tests as
# cores at once fill that wait (2 cores: Release 189 -> 170 s, TSan S3 72 -> 53 s, ASan 308 ->
# 284 s). The TSan cases are CPU-bound and run as many at a time as there are cores.
test_jobs=$((2 * jobs))
quick=0
case "${1:-}" in
  "") ;;
  --quick) quick=1 ;;
  *) echo "usage: bash scripts/test.sh [--quick]" >&2; exit 2 ;;
esac

source scripts/build_env.sh

# --- the stage table ---------------------------------------------------------------------
rows=()
started=$SECONDS
current=""
row() { printf '%-30s %7s  %-22s %s\n' "$@"; }
print_table() {
  local rc=$?
  [ -n "$current" ] && rows+=("$(row "$current" "$((SECONDS - stage_start))" "" FAILED)")
  echo
  echo "== stage times (wall seconds; ccache hits / compiled units)"
  row stage seconds ccache result
  printf '%s\n' "${rows[@]}"
  row total "$((SECONDS - started))" "" "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)"
}
trap print_table EXIT

# stage NAME COMMAND...: runs COMMAND as one stage of the table; a failure ends the run.
stage() {
  current=$1
  shift
  echo "== $current"
  stage_start=$SECONDS
  local hits0 misses0 hits misses cache=""
  read -r hits0 misses0 <<<"$(ccache_counts)"
  "$@"
  read -r hits misses <<<"$(ccache_counts)"
  hits=$((hits - hits0)) misses=$((misses - misses0))
  if [ $((hits + misses)) -gt 0 ]; then
    cache="$hits/$((hits + misses)) ($((100 * hits / (hits + misses)))%)"
  fi
  rows+=("$(row "$current" "$((SECONDS - stage_start))" "$cache" ok)")
  current=""
}

# build DIR CMAKE_OPTIONS... [-- TARGETS...]: configures DIR and builds TARGETS (all without).
build() {
  local dir=$1 options=() targets=()
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do options+=("$1"); shift; done
  [ $# -gt 0 ] && shift && targets=(--target "$@")
  # A folder configured with another compiler starts afresh: CMake would empty its cache by
  # itself, and with it every option given here.
  local compiler=c++ option
  for option in "${options[@]}"; do [[ $option == -DCMAKE_CXX_COMPILER=* ]] && compiler=${option#*=}; done
  if [ -f "$dir/CMakeCache.txt" ] &&
      ! grep -qx "CMAKE_CXX_COMPILER:[A-Z]*=$(command -v "$compiler")" "$dir/CMakeCache.txt"; then
    echo "$dir was configured with another compiler than $compiler: removing it"
    rm -rf "$dir"
  fi
  cmake -S . -B "$dir" "${cmake_tools[@]}" -DNEFFCACHE_BUILD_BENCH=OFF "${options[@]}" >/dev/null
  cmake --build "$dir" -j"$jobs" "${targets[@]}"
}

# What every test needs built, besides the test programs (the programs they run).
programs=(neffcache neuron_parallel_compile neuron-client-sim neffcache-cc fake-neuronx-cc neffcachefs
  lock_helper fuse_reader)

# shards FILTER: the Catch2 cases of the TSan build that FILTER selects, split into shards
# that run as many at a time as there are cores (they are independent: ctest runs every case
# in a process of its own, in parallel, in the other stages). Each shard's output is kept in
# build-tsan/shards/ and shown if it fails.
shards() {
  local count=8 logs=build-tsan/shards
  rm -rf "$logs" && mkdir -p "$logs"
  export filter=$1 count logs
  # --order decl: every shard must list the cases in one order to split them alike.
  seq 0 $((count - 1)) | xargs -P "$jobs" -I{} bash -c '
    if ! (cd build-tsan && tests/neffcache_tests "$filter" --order decl --shard-count "$count" --shard-index {}) \
        >"$logs/{}.log" 2>&1; then
      tail -n 200 "$logs/{}.log"; echo "TSan shard {} of $count failed ($logs/{}.log)"; exit 255
    fi'
  grep -h "^All tests passed\|^test cases:" "$logs"/*.log
}

# install_consumer builds a plain (uninstrumented) program from the installed package: it tests
# packaging, which the Release stage covers. The two largest load tests (1,000 instrumented
# reader processes; 10,000 entries, 90 s instrumented) run in the Release stage only.
largest='^install_consumer$|^1000 readers|^a burst of 10000'
# Nor, under ASan+UBSan, the three longest there (330 s of its 1,750 s of tests, its
# longest case 168 s): 100 kill -9 cycles, whose recovery paths the two single kill -9 cases
# of test_lifecycle.cpp take under ASan too, and the two batches in a memory cgroup, which
# wait on compiles of fake memory and measure what an instrumented build distorts; the
# admission they rely on is unit-tested (test_memory.cpp). The Release stage runs all three.
asan_skip="$largest|^kill -9 of the daemon at random moments|^in a 1.5 GiB cgroup|^the same batch with admission off"

stage setup bash scripts/setup.sh
source scripts/build_env.sh  # again: setup may just have installed ccache and mold

# ASan+UBSan and --quick build with clang, which compiles unoptimized code in far less time
# than GCC: the subcommands' unit in 0.52 of GCC's time under ASan+UBSan (48 against 93 s) and
# 0.71 at -O0 (31 against 43 s). GCC builds Release and TSan, so each compiler's warnings
# (-Werror) see every line.
clang=-DCMAKE_CXX_COMPILER=clang++

if [ "$quick" -eq 1 ]; then
  stage "build (quick, clang -O0)" build build-quick "$clang" -DCMAKE_BUILD_TYPE=Debug -- neffcache_tests neffcache_s3_tests \
    "${programs[@]}" man
  # The tests but the six slowest (over a third of their time): those above, 100 kill -9
  # cycles and the two memory-cgroup batches.
  stage "test (quick)" bash -c "cd build-quick && ctest --output-on-failure -j$test_jobs \
    -E '$asan_skip'"
  exit 0
fi

# Release is what packagers and most users build, and -O3 inlines deepest, where GCC's
# warnings (-Werror) find the most; the sanitizer stages below build Debug. Portable, as the
# packages are (cmake/dependencies.cmake): its test elf_portable reads what the programs load.
# With the benchmarks, which only this build compiles with GCC (bench/run.sh builds them so):
# nothing runs them here, but a warning in one would stop bench/run.sh.
stage "build (Release)" build build -DCMAKE_BUILD_TYPE=Release -DNEFFCACHE_PORTABLE=ON -DNEFFCACHE_BUILD_BENCH=ON
stage "test (Release)" bash -c "cd build && ctest --output-on-failure -j$test_jobs"

# The sanitizer stages build Debug with line tables only (-g1): a report names every frame's
# file and line as with -g, and a unit compiles 10-17% faster (GCC under ASan+UBSan: the
# daemon's parts 115 -> 103 s, the second unit of the tests 163 -> 135 s) into a smaller
# object. A debugger's view of variables needs -g, which --quick keeps.
sanitizer_build=(-DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1)

# The concurrency tests (locks, compile jobs, scheduler, the daemon, S3) under TSan, built by
# GCC: clang 14's TSan runtime (it would build this stage in 217 s, not 296) aborts on a check
# of its own while it writes the report that tests/support/tsan.supp suppresses. It builds
# against the system's libfuse (bookworm's 3.14, without passthrough), so that CI keeps a build
# on it working and runs the mount tests both ways; the other stages use the private 3.17.
export TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$PWD/tests/support/tsan.supp
stage "build (TSan)" build build-tsan "${sanitizer_build[@]}" -DNEFFCACHE_TSAN=ON -DNEFFCACHE_SYSTEM_LIBFUSE=ON -- neffcache_tests neffcache_s3_tests \
  "${programs[@]}"
# Catch2's tag filter selects them (the Catch2 in bookworm-backports cannot turn tags into ctest labels).
stage "test (TSan)" shards '[lock],[compile],[scheduler],[index],[fuse]~[load]'
# The S3 tests (leases raced by threads, compiles by processes) need ctest's radosgw fixture.
# Not the three that drive one thread of the command-line tools through a bucket (95 s of
# the stage's 585 s of tests): the maintenance commands, bundles and a paged listing; the
# Release and ASan stages run them, and sync's threads keep their own tests here.
tsan_s3_skip='^neffcache maintenance commands work on an s3|^a bundle carries|^S3 listing follows every page'
stage "test (TSan, S3)" bash -c "cd build-tsan && ctest --output-on-failure -j$test_jobs -L s3 -E '$tsan_s3_skip'"
unset TSAN_OPTIONS

# Everything that runs; not the headers compiled one by one (header_self_contained), which
# is a compile check the Release stage made already and has nothing to run.
# Without a precompiled header: CMake gives clang its path as an argument of -Xclang, which
# ccache hashes as it is (absolute), so a clone in another folder would compile every unit
# that uses it again (5 of the 17 units, 2 minutes).
stage "build (ASan+UBSan, clang)" build build-asan "$clang" "${sanitizer_build[@]}" -DNEFFCACHE_SANITIZE=ON \
  -DNEFFCACHE_PCH=OFF -- neffcache_tests neffcache_s3_tests "${programs[@]}"
stage "test (ASan+UBSan)" bash -c "cd build-asan && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
  UBSAN_OPTIONS=print_stacktrace=1 ctest --output-on-failure -j$test_jobs -E '$asan_skip'"

seconds=${NEFFCACHE_FUZZ_SECONDS:-30}
stage "build (fuzz)" bash scripts/fuzz.sh --build-only
stage "fuzz (${seconds} s of CPU per target)" bash scripts/fuzz.sh --no-build "$seconds"
